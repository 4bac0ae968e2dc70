"""Starting vLLM engines with the plugin from another environment: offline runs and servers.

vLLM's CPU build pins its own transformers, so it lives in its own virtual environment
(``.venv-vllm``, created by ``scripts/setup.sh``); the tests, the demo and the benchmark
run in the main one and start the engine as a subprocess, one engine per process (the
plugin's switch is read once per process).

Main declarations
-----------------
- :func:`engine_python`, :func:`engine_env`, :func:`fp8_supported`.
- :func:`run_offline`: one ``LLM.generate`` run (:mod:`.offline`) as a JSON record.
- :class:`Server`: vLLM's OpenAI-compatible server on 127.0.0.1, started and stopped by PID.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final

from witcert_adapters.vllm_plugin.config import ENV_VAR, PluginConfig
from witcert_calculus.errors import InvalidValueError

__all__ = ["Server", "engine_env", "engine_python", "fp8_supported", "run_offline"]

_ROOT: Final = Path(__file__).resolve().parents[3]


def engine_python() -> Path:
    """The interpreter of the engine's environment (``<repository>/.venv-vllm``).

    Raises:
        InvalidValueError: the environment does not exist (run ``bash scripts/setup.sh``).
    """
    python = _ROOT / ".venv-vllm" / "bin" / "python"
    if not python.is_file():
        raise InvalidValueError("engine environment", str(python),
                                "missing: run `bash scripts/setup.sh`")
    return python


def fp8_supported() -> bool:
    """Whether vLLM's CPU build serves an fp8 KV cache here (it needs AVX-512 or AMX).

    Read from the CPU's flags, as vLLM decides (``torch.cpu._is_avx512_supported`` and
    ``_is_amx_tile_supported``).
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " avx512f" in flags or " amx_tile" in flags


STEP_TIMEOUT_S: Final = 7200
"""vLLM's time limit for one model step when the plugin is on (its own default: 300 s)."""


def engine_env(config: PluginConfig | None, *, base: Mapping[str, str] | None = None,
               kv_space_gib: int = 1, plugins: bool = True) -> dict[str, str]:
    """The environment of an engine process: the switch (or none) and vLLM's CPU settings.

    Args:
        config: the plugin's configuration, ``None`` for off (the plugin loads, does nothing).
        base: the environment to start from (default: this process's).
        kv_space_gib: vLLM's CPU KV cache space in GiB.
        plugins: ``False`` lets vLLM load no plugin at all (the unpatched engine).
    """
    env = dict(os.environ if base is None else base)
    env.pop(ENV_VAR, None)
    if config is not None:
        env[ENV_VAR] = config.to_env()
    env["CUDA_VISIBLE_DEVICES"] = ""  # vLLM's CPU platform, and no triton placeholder
    env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_space_gib)
    env["VLLM_PLUGINS"] = "witcert" if plugins else "none"
    if config is not None:
        # a metered step (every prefill row in float64, or every row gated) outlasts vLLM's
        # 300-s RPC timeout on long prompts, and the engine would die mid-request
        env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", str(STEP_TIMEOUT_S))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_offline(config: PluginConfig | None, *, model: Path, kv: str, prompts: Sequence[str],
                max_tokens: int = 16, batch_sizes: Sequence[int] = (), repeat: int = 3,
                plugins: bool = True, extra: Sequence[str] = (), timeout: float = 600.0,
                kv_space_gib: int = 1) -> dict[str, Any]:
    """Run :mod:`.offline` in the engine's environment and return its JSON record.

    Raises:
        RuntimeError: the engine process failed (its last output is in the message).
    """
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [str(engine_python()), "-m", "witcert_adapters.vllm_plugin.offline",
               "--model", str(model), "--kv", kv, "--prompts-json", json.dumps(list(prompts)),
               "--max-tokens", str(max_tokens), "--repeat", str(repeat),
               "--batch-sizes", ",".join(str(b) for b in batch_sizes), "--out", str(out),
               *extra]
        proc = subprocess.run(cmd, env=engine_env(config, plugins=plugins,
                                                  kv_space_gib=kv_space_gib), cwd=tmp,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"engine exited with {proc.returncode}:\n"
                               f"{(proc.stdout + proc.stderr)[-6000:]}")
        record: dict[str, Any] = json.loads(out.read_text())
        record["log"] = (proc.stdout + proc.stderr)[-20000:]
        return record


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@final
class Server:
    """vLLM's OpenAI-compatible server with the plugin, on 127.0.0.1.

    Started by :mod:`.serve` in the engine's environment; :meth:`close` stops the process
    group by its PID (SIGTERM, then SIGKILL after ``grace`` seconds).

    Args:
        config: the plugin's configuration (``None``: off).
        model: the model folder; ``kv``: the KV cache dtype.
        startup: seconds to wait for ``/health``.
        log: where the server's output goes.
        extra: more arguments for vLLM's server; ``max_model_len``: its longest request;
        kv_space_gib: its KV cache space.
    """

    def __init__(self, config: PluginConfig | None, *, model: Path, kv: str, log: Path,
                 startup: float = 300.0, extra: Sequence[str] = (), max_model_len: int = 1024,
                 kv_space_gib: int = 1) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [str(engine_python()), "-m", "witcert_adapters.vllm_plugin.serve",
               "--model", str(model), "--kv-cache-dtype", kv, "--dtype", "bfloat16",
               "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
               "--max-model-len", str(max_model_len), "--max-num-seqs", "16",
               "--served-model-name", "smollm2", *extra]
        with log.open("w") as f:
            self.proc = subprocess.Popen(cmd, env=engine_env(config, kv_space_gib=kv_space_gib),
                                         stdout=f,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + startup
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n"
                                   f"{log.read_text()[-6000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2.0) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise TimeoutError(f"server not healthy after {startup} s:\n"
                                   f"{log.read_text()[-6000:]}")
            time.sleep(1.0)

    def request(self, path: str, body: dict[str, Any] | None = None, *,
                headers: Mapping[str, str] | None = None, timeout: float = 120.0
                ) -> tuple[int, Any]:
        """``GET`` (no body) or ``POST`` JSON; returns ``(status, parsed JSON or text)``."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method="GET" if body is None
                                     else "POST", headers={"Content-Type": "application/json",
                                                           **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = int(r.status), r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = int(e.code), e.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def verdicts(self, request_id: str, *, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Poll the side endpoint until the request's verdicts arrive."""
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.request(f"/witcert/verdicts/{request_id}")
            if status == 200:
                found: list[dict[str, Any]] = body["verdicts"]
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"no verdict for {request_id} after {timeout} s: {body}")
            time.sleep(0.2)

    def close(self, grace: float = 20.0) -> None:
        """Stop the server's process group."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
