"""`sao-jax eval --suite humaneval`: HumanEval pass@k of a workdir's model.

Sampling runs the workdir's policy with the jitted sampler (temperature sampling, n
completions per problem); execution and pass@k are `sao_jax.envs.humaneval.evaluate`. The
models trained here use the printable-ASCII char tokenizer, which cannot encode HumanEval's
prompts (newlines, indentation): for them this fails up front with a message saying so.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from sao_jax import checkpoint as ckpt_lib
from sao_jax import config as config_lib
from sao_jax.envs import humaneval
from sao_jax.models import make_model
from sao_jax.packing import encode_prompts, round_up
from sao_jax.runners.compiled import SamplerPrograms, compile_sampler
from sao_jax.sandbox import SandboxPool
from sao_jax.tokenizer import Tokenizer, get_tokenizer


def make_generate(
  tok: Tokenizer, progs: SamplerPrograms, params, prompt_len: int, batch_size: int, seed: int = 0
) -> Callable[[list[str], int], list[list[str]]]:
  """`generate(prompts, n)`: n sampled completions per prompt with `progs.sample`, in
  fixed-size batches of `batch_size` rows (the last one padded)."""
  bs = round_up(batch_size, progs.batch_divisor)

  def generate(prompts: list[str], n: int) -> list[list[str]]:
    rows = [p for p in prompts for _ in range(n)]
    texts: list[str] = []
    key = jax.random.key(seed)
    for i in range(0, len(rows), bs):
      chunk = rows[i : i + bs]
      prompt, pvalid = encode_prompts(tok, chunk + [chunk[-1]] * (bs - len(chunk)), prompt_len)
      key, sub = jax.random.split(key)
      out = np.asarray(progs.sample(params, prompt, pvalid, sub).tokens_bt)
      texts += [tok.decode(out[j]) for j in range(len(chunk))]
    return [texts[j * n : (j + 1) * n] for j in range(len(prompts))]

  return generate


def eval_humaneval_workdir(
  workdir: str | pathlib.Path,
  *,
  n: int = 10,
  num_problems: int | None = None,
  temperature: float = 0.8,
  max_new_tokens: int = 0,
  batch_size: int = 64,
) -> dict[str, Any]:
  """pass@1 and pass@10 (k <= n) of the latest checkpoint in `workdir` on HumanEval.

  Raises:
    ConfigError: the model's tokenizer cannot encode the prompts, or its context cannot hold
      prompt + `max_new_tokens` (0: the run's rl.max_new_tokens).
  """
  directory = ckpt_lib.checkpoint_dir(pathlib.Path(workdir))
  built: dict[str, Any] = {}

  def like_for(meta: dict):
    """Everything the snapshot's config decides, built once; the params to restore onto."""
    cfg = config_lib.from_saved(meta["config"])
    tok = get_tokenizer(cfg.tokenizer)
    problems = humaneval.load_problems()[:num_problems]
    encoded = []
    for p in problems:
      try:
        encoded.append(tok.encode(p.prompt, add_bos=True))
      except ValueError as err:
        raise config_lib.ConfigError(
          f"the model in {workdir} uses the {cfg.tokenizer!r} tokenizer, which cannot encode "
          f"HumanEval prompts ({p.task_id}: {str(err)[:80]}...). HumanEval needs a model whose "
          "tokenizer covers newlines, indentation and the whole prompt text; the harness "
          "itself is sao_jax.envs.humaneval.evaluate(generate, ...) for such a model"
        ) from None
    max_new = max_new_tokens or cfg.rl.max_new_tokens
    prompt_len = round_up(max(map(len, encoded)), 8)
    if prompt_len + max_new > cfg.model.max_len:
      raise config_lib.ConfigError(
        f"HumanEval prompts need {prompt_len} tokens plus {max_new} to generate, more than "
        f"the model's context of {cfg.model.max_len}"
      )
    model = make_model(
      dataclasses.replace(cfg.model, vocab_size=cfg.model.vocab_size or tok.vocab_size)
    )
    progs = compile_sampler(
      cfg,
      model,
      prompt_len=prompt_len,
      max_new_tokens=max_new,
      temperature=temperature,
      eos_id=tok.eos_id,
      pad_id=tok.pad_id,
    )
    built.update(cfg=cfg, tok=tok, problems=problems, prompt_len=prompt_len, progs=progs)
    return progs.abstract_params

  # The newest snapshot that reads cleanly (a damaged one is skipped, left in place).
  params, step, _, _ = ckpt_lib.restore_params_readable(directory, like_for)
  cfg, tok, problems = built["cfg"], built["tok"], built["problems"]
  prompt_len, progs = built["prompt_len"], built["progs"]
  generate = make_generate(tok, progs, params, prompt_len, batch_size, seed=cfg.seed)
  with SandboxPool() as pool:
    result = humaneval.evaluate(
      generate, problems, n=n, ks=[k for k in (1, 10) if k <= n], pool=pool
    )
  return dict(result, checkpoint=str(directory), step=step)
