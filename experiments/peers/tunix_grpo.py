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
accuracy comes from Tunix's own `Sampler` (temperature 0) at the start and after every RL
segment, so the curve gives the wall-clock to a target accuracy.
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


def answer_of(text: str):
  _, sep, tail = text.rpartition("#")
  return tail.strip() if sep else None


def main(spec_path: str, out_path: str):
  spec = json.loads(open(spec_path).read())
  m, r = spec["model"], spec["run"]
  tok = CharTok()
  cfg = qwen3.ModelConfig(num_layers=m["num_layers"], vocab_size=m["vocab_size"],
                          embed_dim=m["embed_dim"], hidden_dim=m["hidden_dim"],
                          num_heads=m["num_heads"], head_dim=m["head_dim"],
                          num_kv_heads=m["num_heads"], rope_theta=10_000, norm_eps=1e-6,
                          use_tied_embedding=True)
  mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
  with mesh:
    model = qwen3.Qwen3(cfg, rngs=nnx.Rngs(r["seed"]))
  n_params = int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))
  train, test = spec["train"], spec["test"][:r["eval_problems"]]
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
      toks[row, :len(seq)] = seq
      loss_m[row, len(p) - 1:len(seq) - 1] = 1.0  # position t predicts token t+1
    return toks, loss_m

  sched = optax.warmup_cosine_decay_schedule(0.0, r["sft_lr"], r["sft_warmup"], r["sft_steps"])
  opt = nnx.Optimizer(model, optax.adamw(sched), wrt=nnx.Param)

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
  samp = sampler_lib.Sampler(model, tok, sampler_lib.CacheConfig(
      cache_size=prompt_len + r["max_new_tokens"] + 8, num_layers=cfg.num_layers,
      num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim))

  def evaluate() -> float:
    correct = 0
    for i in range(0, len(test), r["eval_batch"]):
      chunk = test[i:i + r["eval_batch"]]
      out = samp([t["prompt"] for t in chunk], max_generation_steps=r["max_new_tokens"],
                 max_prompt_length=prompt_len, eos_tokens=[2], temperature=0.0)
      correct += sum(answer_of(txt) == t["answer"] for txt, t in zip(out.text, chunk, strict=True))
    return correct / len(test)

  with mesh:
    te = time.time()
    acc0 = evaluate()
    eval_s = time.time() - te
  print(f"tunix: {n_params} params, SFT {r['sft_steps']} steps in {sft_s:.0f} s, held-out "
        f"accuracy {acc0:.3f}", flush=True)

  # -- GRPO -----------------------------------------------------------------------------------
  def reward(prompts, completions, answer, **_):
    return [float(answer_of(c) == a) for c, a in zip(completions, answer, strict=True)]

  n_prompts = r["prompts_per_step"]
  step_times: list[float] = []
  mark = [time.time()]

  def batches(n):
    for _ in range(n):
      now = time.time()
      step_times.append(now - mark[0])
      mark[0] = now
      idx = rng.integers(0, len(train), n_prompts)
      yield {"prompts": [train[i]["prompt"] for i in idx],
             "answer": [train[i]["answer"] for i in idx]}

  seg_steps, n_seg = r["segment_steps"], r["segments"]
  curve = [(0.0, 0, acc0)]
  rl_s, steps = 0.0, 0
  with mesh:
    cluster = rl_cluster_lib.RLCluster(
        actor=model, reference=model, tokenizer=tok,
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh,
                          rl_cluster_lib.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adamw(optax.warmup_constant_schedule(
                    0.0, r["rl_lr"], r["rl_warmup"])),
                eval_every_n_steps=10**9, max_steps=seg_steps * n_seg,
                mini_batch_size=n_prompts, rollout_micro_batch_size=n_prompts,
                compute_logps_micro_batch_size=n_prompts),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=r["max_new_tokens"], max_prompt_length=prompt_len,
                kv_cache_size=prompt_len + r["max_new_tokens"] + 8,
                temperature=r["temperature"], top_p=1.0, top_k=None, eos_tokens=[2])))
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=[reward],
        algo_config=grpo_learner.GRPOConfig(num_generations=r["group_size"], num_iterations=1,
                                            beta=0.0, epsilon=0.2))
    for seg in range(n_seg):
      mark[0] = time.time()
      ts = time.time()
      # the learner stops at max_steps overall: each call trains one more segment
      cluster.cluster_config.training_config.max_steps = seg_steps * (seg + 1)
      learner.train(batches(seg_steps + 1))
      rl_s += time.time() - ts
      steps = seg_steps * (seg + 1)
      acc = evaluate()
      curve.append((round(rl_s, 2), steps, acc))
      print(f"tunix: GRPO step {steps}, {rl_s:.0f} s, held-out accuracy {acc:.3f}", flush=True)
  per_step = np.asarray(step_times[2:] if len(step_times) > 3 else step_times)
  traj = steps * n_prompts * r["group_size"]
  json.dump({"framework": "tunix", "tunix_version": _version(), "jax": jax.__version__,
             "model": "qwen3 (tunix.models.qwen3)", "model_params": n_params,
             "sft_steps": r["sft_steps"], "sft_seconds": sft_s, "sft_accuracy": acc0,
             "eval_seconds_once": eval_s, "steps": steps, "rl_seconds": rl_s,
             "trajectories": traj, "trajectories_per_s": traj / rl_s,
             "steady_step_s_median": float(np.median(per_step)) if per_step.size else None,
             "trajectories_per_s_steady": (n_prompts * r["group_size"] / float(np.median(
                 per_step))) if per_step.size else None,
             "eval_curve": curve, "accuracy": curve[-1][2]}, open(out_path, "w"), indent=2)


def _version():
  from importlib.metadata import version
  return version("google-tunix")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
