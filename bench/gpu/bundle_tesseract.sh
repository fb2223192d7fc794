#!/usr/bin/env bash
# Bundle this machine's tesseract (+ its libraries, the osd and eng data) for a machine without tesseract-ocr:
# `[render] rotate_pages` (on by default) runs `tesseract --psm 0` on every page and refuses to start without
# tesseract and its osd data. The wrapper sets LD_LIBRARY_PATH for tesseract alone (libstdc++ and libgcc_s
# included: the GPU image's may be older) and TESSDATA_PREFIX to the bundle's own data, so neither the
# machine's tessdata nor a TESSDATA_PREFIX of the caller is read.
# The bundle (about 77 MB: ICU's data alone is 31 MB) is packed as OUT_DIR/bundle.tar.xz (about 23 MB at
# XZ_LEVEL 9), small enough to carry to the device; env.sh unpacks it there. OUT_DIR/glibc-needed names the
# newest glibc symbol version it needs (the GPU machine's glibc must be at least that).
# Usage: bash bench/gpu/bundle_tesseract.sh OUT_DIR   (needs tesseract-ocr, -eng and -osd here)
set -euo pipefail
dest=${1:?out dir}
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
bin=$(command -v tesseract) || { echo "no tesseract here: apt-get install tesseract-ocr" >&2; exit 1; }
# Where this tesseract reads its data: the folder --list-langs names (TESSDATA_PREFIX of the caller ignored).
data=$(env -u TESSDATA_PREFIX "$bin" --list-langs 2>&1 | sed -n 's/^List of available languages in "\(.*\)".*/\1/p')
data=${data%/}
for lang in osd eng; do
  [ -f "$data/$lang.traineddata" ] || { echo "no $lang.traineddata in '$data'" >&2; exit 1; }
done
mkdir -p "$out"/{bin,libexec,lib,tessdata}
skip='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64)\.so'
cp "$bin" "$out/libexec/tesseract"
for lib in $(ldd "$bin" | awk '/=>/ {print $3}'); do
  basename "$lib" | grep -qE "$skip" || cp -nL "$lib" "$out/lib/"
done
cp "$data/osd.traineddata" "$data/eng.traineddata" "$out/tessdata/"
# configs: the output formats --psm 6 ... tsv (orientation's reading check) and hocr name.
for d in configs tessconfigs; do if [ -d "$data/$d" ]; then cp -r "$data/$d" "$out/tessdata/"; fi; done
cat > "$out/bin/tesseract" <<'W'
#!/bin/sh
# Shell built-ins only where it can: the caller's PATH may hold nothing but this folder.
f=$0; case $f in */*) ;; *) f=./$f ;; esac
if command -v readlink >/dev/null 2>&1; then f=$(readlink -f "$f"); fi
d=$(cd "${f%/*}/.." && pwd -P)
LD_LIBRARY_PATH="$d/lib" TESSDATA_PREFIX="$d/tessdata" exec "$d/libexec/tesseract" "$@"
W
chmod +x "$out/bin/tesseract"
# The newest glibc symbol version any of it needs: the GPU machine's glibc must be at least this.
need=$(for f in "$out"/libexec/* "$out"/lib/*; do objdump -T "$f" 2>/dev/null; done | grep -o 'GLIBC_2\.[0-9]*' |
  sort -t. -k2,2n -u | tail -1 || true)
"$out/bin/tesseract" --version 2>&1 | head -1
rm -rf "$dest"; mkdir -p "$dest"
echo "${need:-GLIBC_?}" > "$dest/glibc-needed"
tar cf - -C "$out" . | xz -T"${XZ_THREADS:-0}" -"${XZ_LEVEL:-9}" > "$dest/bundle.tar.xz"
echo "needs ${need:-?}; $(du -sh "$out" | cut -f1) unpacked, $(du -sh "$dest/bundle.tar.xz" | cut -f1) packed"
