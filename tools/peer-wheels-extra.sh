#!/usr/bin/env bash
# Download every peer wheel (Liger, QuACK and its CuTe DSL stack as ../shared/device/peer-wheels.sh
# names them, plus FlashInfer, the cuDNN frontend, fla and their dependencies) for the GPU
# machine (Python 3.12, x86-64, no registry; torch 2.11 and triton 3.6 already there), and cut
# them into git-ignored folders small enough to travel beside the working tree.
# Run from the project root:    bash tools/peer-wheels-extra.sh [PART_MB]
#   PART_MB (default 30): each folder's size; --resplit (after PART_MB) cuts the parts already here
#   again instead of downloading; the tracked tree travels too (~22 MB now), and a
#   call carries at most 64 MiB in all, so PART_MB + tree must stay under 64 MiB.
# It writes .pw1/ .pw2/ ... (all ignored through .git/info/exclude): one tar of every wheel,
# split in parts, one part and the same install.sh in each folder. On the GPU machine, carry
# one folder per call, in order, in consecutive calls (the machine stays warm 30 s between):
#     bash .pwK/install.sh        (K = 1, 2, ...)
# Each call adds its part to ~/.rmsnorm-peers/pw-parts; the call with the last part joins them and
# installs every wheel into ~/.rmsnorm-peers/site. FlashInfer's wheels lead the tar: the first
# call whose parts hold them whole (the second, at 36 MB parts) installs them alone into
# ~/.rmsnorm-peers/site-early, so fp8 work beside FlashInfer can start there. Then, before Python runs:
#     source ~/.rmsnorm-peers/env.sh
set -euo pipefail
part_mb=${1:-30}
root=$(git rev-parse --show-toplevel)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.pw\*/' "$exclude" 2>/dev/null || echo '/.pw*/' >> "$exclude"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$stage/wheels" "$@"
}
# (--resplit below re-tars what it unpacks, in the order written further down)
# peer-wheels.sh's set (same versions), then the new peers and what they import that the
# machine lacks (its image has einops, click, requests, tabulate, tqdm, ninja, numpy, packaging,
# nvidia-ml-py, cuda-bindings/cuda-core/cuda-pathfinder and nvidia-cudnn-cu13 already).
if [ "${2:-}" = "--resplit" ]; then
  # cut the parts already here again at PART_MB (when the tree has grown past the carry limit)
  n=$(ls -d .pw[0-9]* | wc -l)
  for i in $(seq 1 "$n"); do cat ".pw$i/part_$i"; done > "$stage/peers.tar"
  mkdir -p "$stage/wheels" && tar -C "$stage" -xf "$stage/peers.tar" && rm "$stage/peers.tar"
else
dl liger-kernel==0.8.5 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1 \
  nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
  nvidia-cutlass-dsl-libs-cu13==4.8.1 'apache-tvm-ffi>=0.1.15,<0.2' torch-c-dlpack-ext \
  flashinfer-python==0.7.2.post1 nvidia-cudnn-frontend==1.32.0 fla-core==0.6.0 cuda-tile==1.7.0
fi
# FlashInfer (and the tvm-ffi it imports) first in the tar: the first parts then hold its wheels
# whole, and install.sh installs them early, so fp8 work beside FlashInfer needs two calls, not all
(cd "$stage" && tar -cf peers.tar wheels/apache_tvm_ffi-* wheels/flashinfer_python-* \
  $(ls wheels/*.whl | grep -v -e apache_tvm_ffi- -e flashinfer_python-))
rm -rf .pw[0-9]*
split -b "${part_mb}000000" -d -a 2 "$stage/peers.tar" "$stage/part_"
parts=$(ls "$stage"/part_* | wc -l)
k=0
for part in "$stage"/part_*; do
  k=$((k + 1))
  mkdir -p ".pw$k"
  mv "$part" ".pw$k/part_$k"
  cat > ".pw$k/install.sh" <<EOS
#!/usr/bin/env bash
# Part $k of $parts of the peer wheels (tools/peer-wheels-extra.sh). Run from the project root.
set -e
P="\$HOME/.rmsnorm-peers"
mkdir -p "\$P/pw-parts"
cp .pw$k/part_$k "\$P/pw-parts/"
have=\$(ls "\$P/pw-parts" | wc -l)
if [ "\$have" -lt $parts ]; then
  echo "peer wheels: part $k of $parts stored (\$have here)"
  # FlashInfer's wheels lead the tar: install them as soon as the parts so far hold them whole
  if [ ! -f "\$P/site-early/.done" ] && [ -f "\$P/pw-parts/part_1" ]; then
    rm -rf "\$P/early" && mkdir -p "\$P/early"
    i=1; while [ -f "\$P/pw-parts/part_\$i" ]; do cat "\$P/pw-parts/part_\$i"; i=\$((i + 1)); done \
      | tar -C "\$P/early" -xf - 2>/dev/null || true
    ok=1
    for w in "\$P"/early/wheels/apache_tvm_ffi-*.whl "\$P"/early/wheels/flashinfer_python-*.whl; do
      python3 -c "import sys, zipfile; sys.exit(zipfile.ZipFile(sys.argv[1]).testzip() is not None)" "\$w" 2>/dev/null || ok=0
    done
    if [ "\$ok" = 1 ]; then
      rm -rf "\$P/site-early"  # an interrupted earlier try: pip --target would skip what it left
      if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "\$P/site-early" \
          "\$P"/early/wheels/apache_tvm_ffi-*.whl "\$P"/early/wheels/flashinfer_python-*.whl; then
        touch "\$P/site-early/.done"
        printf 'export PYTHONPATH=%s/site-early\${PYTHONPATH:+:\$PYTHONPATH}\n' "\$P" > "\$P/env.sh"
        echo "FlashInfer installed early in \$P/site-early: source \$P/env.sh"
      fi
    fi
    rm -rf "\$P/early"
  fi
  exit 0
fi
for i in \$(seq 1 $parts); do cat "\$P/pw-parts/part_\$i"; done > "\$P/peers.tar"
rm -rf "\$P/wheels" && tar -C "\$P" -xf "\$P/peers.tar" && rm -f "\$P/peers.tar"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "\$P/site" "\$P"/wheels/*.whl
printf 'export PYTHONPATH=%s/site:%s/site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}\n' "\$P" "\$P" > "\$P/env.sh"
echo "peer wheels installed in \$P/site: source \$P/env.sh"
EOS
done
ls -l "$stage/wheels"
du -sh .pw[0-9]*
