"""`sao-jax` command line: train, eval, export (a run's policy for other tools), sweep, replay
(re-derive an asynchronous run bit for bit from its journal), broker, the two roles of a
multi-machine SAO run (learner, sampler), and simulate (the calibrated cluster model)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from sao_jax.config import ConfigError
from sao_jax.runners.sampler_proc import SamplerError
from sao_jax.transport.broker import BrokerError


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="sao-jax", description=__doc__)
  sub = p.add_subparsers(dest="command", required=True)
  t = sub.add_parser("train", help="train from a config file (SFT warm start, then RL)")
  t.add_argument(
    "--config",
    required=True,
    help="Python config file, optionally with :variant (e.g. ...arith.py:tiny)",
  )
  t.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="override a config value, e.g. --set rl.optim.lr=1e-4 (repeatable)",
  )
  t.add_argument("--workdir", required=True, help="where metrics, checkpoints and summary go")
  t.add_argument("--no-progress", action="store_true", help="no progress bar")
  ln = sub.add_parser(
    "learner",
    help="the SAO learner alone, over Kafka: samplers on any "
    "machine join with `sao-jax sampler` (same options as train)",
  )
  ln.add_argument("--config", required=True)
  ln.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  ln.add_argument("--workdir", required=True)
  ln.add_argument(
    "--local-samplers",
    type=int,
    default=0,
    help="sampler processes on this machine too (default 0)",
  )
  ln.add_argument("--no-progress", action="store_true")
  sm = sub.add_parser("sampler", help="sampler processes that join a running SAO learner")
  sm.add_argument("--bootstrap", required=True, help="the run's Kafka bootstrap servers")
  sm.add_argument("--run-id", required=True, help="the run id the learner printed")
  sm.add_argument("--num", type=int, default=1, help="sampler processes on this machine")
  sm.add_argument("--threads", type=int, default=0, help="XLA threads per sampler")
  sm.add_argument(
    "--wait", type=float, default=600.0, help="seconds to wait for the learner's announcement"
  )
  sm.add_argument(
    "--key-file",
    default=None,
    help="a copy of the learner's WORKDIR/run.key (or set SAO_JAX_RUN_KEY to its hex digits): "
    "the run's messages are sealed with it",
  )
  sm.add_argument(
    "--security-protocol",
    default="PLAINTEXT",
    choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
    help="TLS / SASL to the broker; the SASL password from SAO_JAX_KAFKA_PASSWORD",
  )
  sm.add_argument("--ssl-cafile", default="", help="CA bundle that signed the broker's certificate")
  sm.add_argument("--ssl-certfile", default="", help="a client certificate (with --ssl-keyfile)")
  sm.add_argument("--ssl-keyfile", default="")
  sm.add_argument(
    "--sasl-mechanism", default="PLAIN", choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
  )
  sm.add_argument("--sasl-username", default="")
  b = sub.add_parser("broker", help="run a local Kafka-protocol broker until Ctrl-C")
  b.add_argument("--host", default="127.0.0.1")
  b.add_argument("--port", type=int, default=9092)
  sw = sub.add_parser(
    "sweep",
    help="run or resume a hyperparameter sweep (a sweep file's "
    "get_sweep(variant)); rerun the same command to resume",
  )
  sw.add_argument("sweep", help="sweep file, optionally with :variant")
  sw.add_argument("--dir", required=True, help="where the study, trials and reports go")
  sw.add_argument(
    "--parallel", type=int, default=None, help="trials at once (default: the number of cores)"
  )
  sw.add_argument("--no-progress", action="store_true")
  si = sub.add_parser(
    "simulate",
    help="discrete-event model of GRPO/SAO on measured costs "
    "(experiments/calibrate_sim.py writes them)",
  )
  si.add_argument(
    "--costs", required=True, help="costs JSON written by experiments/calibrate_sim.py"
  )
  si.add_argument(
    "--policy",
    default="grpo_inline,sao_batch,sao_continuous,sao_inflight",
    help="comma-separated: grpo_inline, grpo, grpo_continuous, sao_batch, "
    "sao_continuous, sao_inflight",
  )
  si.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="a scenario field, e.g. --set num_samplers=4 (repeatable)",
  )
  si.add_argument("--out", default="", help="also write the metrics as JSON here")
  rp = sub.add_parser(
    "replay",
    help="re-execute a finished SAO run's updates from its journal and check loss, gradient "
    "norm and parameters bit for bit (needs recovery.keep_journal=True)",
  )
  rp.add_argument("workdir", help="the run's workdir")
  rp.add_argument(
    "--until", type=int, default=None, help="stop after this update; write its state and batch"
  )
  rp.add_argument("--out", default=None, help="report, state and batch (default WORKDIR/replay)")
  rp.add_argument("--no-progress", action="store_true")
  e = sub.add_parser(
    "eval",
    help="held-out greedy accuracy of a workdir's latest checkpoint, "
    "or HumanEval pass@1/pass@10 (--suite humaneval)",
  )
  e.add_argument("--workdir", required=True)
  e.add_argument("--num", type=int, default=None, help="number of test problems")
  e.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="KEY=VALUE",
    help="heldout: evaluate on another test split, e.g. --set task.n_ops=3 (the model stays "
    "the checkpoint's)",
  )
  e.add_argument(
    "--suite",
    default="heldout",
    choices=("heldout", "humaneval"),
    help="heldout: the run's own test split (default); humaneval: sandboxed "
    "HumanEval, needs a tokenizer that can encode its prompts",
  )
  e.add_argument("--samples", type=int, default=10, help="humaneval: completions per problem")
  x = sub.add_parser(
    "export",
    help="a workdir's policy as a directory other tools load: Hugging Face (config.json, "
    "safetensors, tokenizer) for arch='llama' models; weights and config for the char model",
  )
  x.add_argument("workdir", help="the run's workdir (or one of its checkpoint folders)")
  x.add_argument("--out", required=True, help="directory to write (new, or an earlier export)")
  x.add_argument("--step", type=int, default=None, help="snapshot step (default: the latest)")
  x.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
  x.add_argument(
    "--reference",
    action="store_true",
    help="also write this code's logits on a few texts (sao_jax_reference.npz), for "
    "scripts/make_hf_fixtures.py --check-export",
  )
  return p


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  import faulthandler
  import logging
  import signal

  # `kill -USR1 PID` prints every thread's stack to stderr: for a run that seems stuck.
  # (Called in-process with a stderr that is no file, e.g. a notebook's: no such hook.)
  with contextlib.suppress(io.UnsupportedOperation, ValueError, AttributeError):
    faulthandler.register(signal.SIGUSR1, all_threads=True)
  # kafka-python logs every reconnect attempt and slow I/O task; our own errors name the
  # broker, so only its errors are shown.
  logging.getLogger("kafka").setLevel(logging.ERROR)
  # The runners (and their process machinery) load only for the command that needs them.
  from sao_jax.setup import load_config

  try:
    if args.command in ("train", "learner"):
      overrides = list(args.set)
      if args.command == "learner":
        overrides += [
          "transport.kind=kafka",
          "rl.algorithm=sao",
          f"samplers.num={args.local_samplers}",
        ]
      cfg = load_config(args.config, overrides=overrides)
      from sao_jax import interrupt
      from sao_jax.runners.run import run

      with interrupt.at_step_boundaries():  # Ctrl-C stops between steps (again: at once)
        summary = run(cfg, args.workdir, show_progress=not args.no_progress)
      keep = {k: summary[k] for k in ("sft", "start", "rl", "wall_s") if k in summary}
      for v in keep.values():
        if isinstance(v, dict):
          v.pop("eval_curve", None)
      print(json.dumps(keep, indent=2))
      print(f"results: {args.workdir}/summary.json, metrics.jsonl, tb/")
    elif args.command == "sampler":
      from sao_jax.runners.roles import run_sampler_role
      from sao_jax.transport import auth, kafka_security

      try:
        key = auth.key_from(args.key_file)
        security = kafka_security.settings(
          args.security_protocol,
          cafile=args.ssl_cafile,
          certfile=args.ssl_certfile,
          keyfile=args.ssl_keyfile,
          mechanism=args.sasl_mechanism,
          username=args.sasl_username,
        )
        kafka_security.with_secrets(security)  # a missing password: said now, not later
      except ValueError as err:
        raise ConfigError(str(err)) from None
      return run_sampler_role(
        args.bootstrap,
        args.run_id,
        args.num,
        args.threads,
        wait_s=args.wait,
        key=key,
        security=security,
      )
    elif args.command == "sweep":
      from sao_jax.sweep import run_sweep

      summary = run_sweep(
        args.sweep, args.dir, parallel=args.parallel, show_progress=not args.no_progress
      )
      print(json.dumps(summary, indent=2))
      return 0 if summary["status"].get("complete") else 1
    elif args.command == "replay":
      from sao_jax.replay import format_report, replay

      report = replay(
        args.workdir, until=args.until, out=args.out, show_progress=not args.no_progress
      )
      print(format_report(report))
      return 0 if report["all_equal"] else 1
    elif args.command == "broker":
      return _broker(args.host, args.port)
    elif args.command == "eval" and args.suite == "humaneval":
      from sao_jax.runners.code_eval import eval_humaneval_workdir

      result = eval_humaneval_workdir(args.workdir, n=args.samples, num_problems=args.num)
      print(json.dumps({k: v for k, v in result.items() if k != "per_problem"}, indent=2))
    elif args.command == "export":
      from sao_jax.runners.export import export_workdir

      report = export_workdir(
        args.workdir, args.out, step=args.step, dtype=args.dtype, reference=args.reference
      )
      print(json.dumps(report, indent=2))
      print(f"exported: {args.out}")
    elif args.command == "simulate":
      return _simulate(args.costs, args.policy.split(","), args.set, args.out)
    elif args.command == "eval":
      from sao_jax.runners.run import eval_workdir

      print(json.dumps(eval_workdir(args.workdir, args.num, args.set), indent=2))
  except (ConfigError, FileNotFoundError, FileExistsError) as err:
    print(f"sao-jax: error: {err}", file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print("sao-jax: interrupted; all processes stopped", file=sys.stderr)
    return 130
  except BrokerError as err:
    print(f"sao-jax: error: {err}", file=sys.stderr)
    return 2
  except SamplerError as err:
    print(f"sao-jax: error: {err}", file=sys.stderr)
    return 1
  return 0


def _simulate(costs_path: str, policies: list[str], overrides: list[str], out: str) -> int:
  import pathlib

  from sao_jax import config as config_lib
  from sao_jax import sim

  try:
    raw = json.loads(pathlib.Path(costs_path).read_text())
  except json.JSONDecodeError as err:
    raise ConfigError(f"{costs_path} is not JSON: {err}") from None
  costs = sim.Costs.from_dict(raw.get("costs", raw))
  base = config_lib.apply_overrides(sim.Scenario(seconds=240.0), overrides)
  results = {name: sim.simulate(costs, sim.preset(name, base)) for name in policies}
  print(sim.format_table(results))
  if out:
    pathlib.Path(out).write_text(
      json.dumps({"costs_file": costs_path, "overrides": overrides, "results": results}, indent=2)
    )
    print(f"results: {out}")
  return 0


def _broker(host: str, port: int) -> int:
  import signal
  import threading

  from sao_jax.transport.broker import LocalBroker

  done = threading.Event()
  signal.signal(signal.SIGTERM, lambda *_: done.set())
  with LocalBroker(host=host, port=port) as broker:
    print(
      f"broker ready: --set transport.bootstrap_servers={broker.bootstrap} "
      f"(log: {broker.log_path}); Ctrl-C stops it",
      flush=True,
    )
    try:
      while not done.wait(0.5):
        if broker.proc.poll() is not None:
          print(
            f"sao-jax: error: the broker exited ({broker.proc.returncode}); log: {broker.log_path}",
            file=sys.stderr,
          )
          return 1
    except KeyboardInterrupt:
      pass
  print("broker stopped", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
