"""Tunix's GRPO learner on our arithmetic tasks; run by experiments/bench_peers.py inside its
own virtual environment (google-tunix is not a dependency of sao_jax).

  .venv-tunix/bin/python experiments/peers/tunix_grpo.py SPEC.json OUT.json

SPEC (written by bench_peers.py) holds the tasks as text (prompt, solution, answer), the
character vocabulary of sao_jax's CharTokenizer (PAD 0, BOS 1, EOS 2, then printable
ASCII: the same token ids), the model shape and the run settings. The policy is Tunix's
Qwen3 (`tunix.models.qwen3`) sized to sao_jax's model's parameter count; it is warmed up
by supervised steps on the worked solutions (an optax loop over the Tunix model, same
steps, batch and learning rate as sao_jax's SFT), then trained by
`tunix.rl.grpo.grpo_learner.GRPOLearner` on the vanilla rollout engine. Held-out greedy
accuracy comes from Tunix's own `Sampler` (temperature 0) before and after RL; the training
reward of every step (mean over its sampled rows, as our runners log `accuracy`) with its
wall-clock time gives the curve for the time to a target reward.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh
from tunix.generate import sampler as sampler_lib
from tunix.models.qwen3 import model as qwen3
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout


class CharTok:
  """sao_jax's CharTokenizer ids, in the shape Tunix's TokenizerAdapter accepts."""

  OFFSET, FIRST, LAST = 3, 32, 126

  def encode(self, text, **_):
    if not isinstance(text, str):  # Tunix also tokenizes whole batches (arrays of prompts)
      return [self.encode(t) for t in text]
    return [1] + [ord(c) - self.FIRST + self.OFFSET for c in text]

  def decode(self, ids, **_):
    out = []
    for i in np.asarray(ids).tolist():
      if i == 2:
        break
      if i >= self.OFFSET:
        out.append(chr(i - self.OFFSET + self.FIRST))
    return "".join(out)

  def bos_id(self):
    return 1

  def eos_id(self):
    return 2

  def pad_id(self):
    return 0


def optimizer(o: dict) -> optax.GradientTransformation:
  """sao_jax.learner.make_optimizer: clip, then AdamW with a linear warm-up, then constant."""
  warmup = max(o["warmup_steps"], 1)
  schedule = optax.linear_schedule(o["lr"] / warmup, o["lr"], warmup)
  return optax.chain(
    optax.clip_by_global_norm(o["grad_clip"]),
    optax.adamw(schedule, b2=o["b2"], weight_decay=o["weight_decay"]),
  )


def answer_of(text: str):
  _, sep, tail = text.rpartition("#")
  return tail.strip() if sep else None


def main(spec_path: str, out_path: str):
  spec = json.loads(open(spec_path).read())
  m, r = spec["model"], spec["run"]
  tok = CharTok()
  cfg = qwen3.ModelConfig(
    num_layers=m["num_layers"],
    vocab_size=m["vocab_size"],
    embed_dim=m["embed_dim"],
    hidden_dim=m["hidden_dim"],
    num_heads=m["num_heads"],
    head_dim=m["head_dim"],
    num_kv_heads=m["num_heads"],
    rope_theta=10_000,
    norm_eps=1e-6,
    use_tied_embedding=True,
  )
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
  with mesh:
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(r["seed"]))
  n_params = int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
  train, test = spec["train"], spec["test"][: r["eval_problems"]]
  rng = np.random.default_rng(r["seed"])

  # -- supervised warm start ------------------------------------------------------------------
  L = r["sft_len"]

  def sft_batch(idx):
    toks = np.zeros((len(idx), L), np.int32)
    loss_m = np.zeros((len(idx), L), np.float32)
    for row, i in enumerate(idx):
      p = tok.encode(train[i]["prompt"])
      s = [ord(c) - tok.FIRST + tok.OFFSET for c in train[i]["solution"]] + [2]
      seq = (p + s)[:L]
      toks[row, : len(seq)] = seq
      loss_m[row, len(p) - 1 : len(seq) - 1] = 1.0  # position t predicts token t+1
    return toks, loss_m

  opt = nnx.Optimizer(model, optimizer(r["sft_optim"]), wrt=nnx.Param)

  @nnx.jit
  def sft_step(model, opt, toks, loss_m):
    valid = toks != 0
    pos = jnp.maximum(jnp.cumsum(valid, -1) - 1, 0)
    mask = jnp.tril(jnp.ones((L, L), bool))[None] & valid[:, None, :]

    def loss_fn(model):
      logits, _ = model(toks, pos, None, mask)
      lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
      nll = -jnp.take_along_axis(lp, toks[:, 1:, None], -1)[..., 0]
      return jnp.sum(nll * loss_m[:, :-1]) / jnp.maximum(loss_m.sum(), 1)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss

  t0 = time.time()
  with mesh:
    for _ in range(r["sft_steps"]):
      sft_step(model, opt, *sft_batch(rng.integers(0, len(train), r["sft_batch"])))
  sft_s = time.time() - t0

  prompt_len = r["prompt_len"]

  def evaluate(policy) -> float:
    samp = sampler_lib.Sampler(
      policy,
      tok,
      sampler_lib.CacheConfig(
        cache_size=prompt_len + r["max_new_tokens"] + 8,
        num_layers=cfg.num_layers,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
      ),
    )
    correct = 0
    for i in range(0, len(test), r["eval_batch"]):
      chunk = test[i : i + r["eval_batch"]]
      out = samp(
        [t["prompt"] for t in chunk],
        max_generation_steps=r["max_new_tokens"],
        max_prompt_length=prompt_len,
        eos_tokens=[2],
        temperature=0.0,
      )
      correct += sum(answer_of(txt) == t["answer"] for txt, t in zip(out.text, chunk, strict=True))
    return correct / len(test)

  with mesh:
    te = time.time()
    acc0 = evaluate(model)
    eval_s = time.time() - te
  print(
    f"tunix: {n_params} params, SFT {r['sft_steps']} steps in {sft_s:.0f} s, held-out "
    f"accuracy {acc0:.3f}",
    flush=True,
  )

  # -- GRPO -----------------------------------------------------------------------------------
  # Each step's rewards are computed once, so the reward function is where a step's wall-clock
  # time and its mean training reward (sampled at the RL temperature) are recorded.
  reward_log: list[tuple[float, float]] = []

  def reward(prompts, completions, answer, mode="", **_):
    rs = [float(answer_of(c) == a) for c, a in zip(completions, answer, strict=True)]
    if "train" in str(mode).lower():
      reward_log.append((time.time(), float(np.mean(rs))))
    return rs

  n_prompts, steps = r["prompts_per_step"], r["rl_steps"]

  def batches():
    for _ in range(steps + 2):
      idx = rng.integers(0, len(train), n_prompts)
      # arrays, not lists: Tunix repeats each leaf G times with jax.tree.map
      yield {
        "prompts": np.array([train[i]["prompt"] for i in idx]),
        "answer": np.array([train[i]["answer"] for i in idx]),
      }

  with mesh:
    cluster = rl_cluster_lib.RLCluster(
      actor=model,
      reference=model,
      tokenizer=tok,
      cluster_config=rl_cluster_lib.ClusterConfig(
        role_to_mesh={
          rl_cluster_lib.Role.ACTOR: mesh,
          rl_cluster_lib.Role.REFERENCE: mesh,
          rl_cluster_lib.Role.ROLLOUT: mesh,
        },
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
          actor_optimizer=optimizer(r["rl_optim"]),
          eval_every_n_steps=10**9,
          max_steps=steps,
          mini_batch_size=n_prompts,
          rollout_micro_batch_size=n_prompts,
          compute_logps_micro_batch_size=n_prompts,
        ),
        rollout_config=base_rollout.RolloutConfig(
          max_tokens_to_generate=r["max_new_tokens"],
          max_prompt_length=prompt_len,
          kv_cache_size=prompt_len + r["max_new_tokens"] + 8,
          temperature=r["temperature"],
          top_p=1.0,
          top_k=None,
          eos_tokens=[2],
        ),
      ),
    )
    learner = grpo_learner.GRPOLearner(
      rl_cluster=cluster,
      reward_fns=[reward],
      algo_config=grpo_learner.GRPOConfig(
        num_generations=r["group_size"], num_iterations=1, beta=0.0, epsilon=0.2
      ),
    )
    t_rl = time.time()
    learner.train(batches())
    rl_s = time.time() - t_rl
    # the cluster trains its own (resharded) copy of the policy, not `model`
    acc = evaluate(cluster.actor_trainer.model)
  print(f"tunix: GRPO {steps} steps in {rl_s:.0f} s, held-out accuracy {acc:.3f}", flush=True)
  times = np.array([t for t, _ in reward_log])
  gaps = np.diff(times)
  per_step = float(np.median(gaps[2:] if gaps.size > 3 else gaps)) if gaps.size else None
  traj = steps * n_prompts * r["group_size"]
  json.dump(
    {
      "framework": "tunix",
      "tunix_version": _version(),
      "jax": jax.__version__,
      "model": "qwen3 (tunix.models.qwen3)",
      "model_params": n_params,
      "sft_steps": r["sft_steps"],
      "sft_seconds": sft_s,
      "sft_accuracy": acc0,
      "eval_seconds_once": eval_s,
      "steps": steps,
      "rl_seconds": rl_s,
      "trajectories": traj,
      "trajectories_per_s": traj / rl_s,
      "steady_step_s_median": per_step,
      "trajectories_per_s_steady": (n_prompts * r["group_size"] / per_step if per_step else None),
      "reward_curve": [(round(t - t_rl, 3), k + 1, rw) for k, (t, rw) in enumerate(reward_log)],
      "accuracy": acc,
    },
    open(out_path, "w"),
    indent=2,
  )


def _version():
  from importlib.metadata import version

  return version("google-tunix")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
