#!/usr/bin/env bash
# Bundle this machine's pdftoppm/pdfinfo (+ libraries, fonts) for a machine without poppler-utils.
# Usage: bash bench/gpu/bundle_poppler.sh OUT_DIR      (needs poppler-utils here: apt-get install poppler-utils)
set -euo pipefail
out=${1:?out dir}
rm -rf "$out"; mkdir -p "$out"/{bin,libexec,lib,fonts}
skip='^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so'
for b in pdftoppm pdfinfo pdfunite; do
  cp "$(command -v $b)" "$out/libexec/$b"
  for lib in $(ldd "$(command -v $b)" | awk '/=>/ {print $3}'); do
    basename "$lib" | grep -qE "$skip" || cp -nL "$lib" "$out/lib/"
  done
  cat > "$out/bin/$b" <<'W'
#!/bin/sh
d=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
LD_LIBRARY_PATH="$d/lib" FONTCONFIG_FILE="$d/fonts.conf" exec "$d/libexec/$(basename "$0")" "$@"
W
  chmod +x "$out/bin/$b"
done
for f in DejaVuSans.ttf DejaVuSans-Bold.ttf DejaVuSerif.ttf DejaVuSansMono.ttf; do cp /usr/share/fonts/truetype/dejavu/$f "$out/fonts/" 2>/dev/null || true; done
cat > "$out/fonts.conf" <<'F'
<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "urn:fontconfig:fonts.dtd">
<fontconfig>
  <dir prefix="relative">fonts</dir>
  <dir>/usr/share/fonts</dir>
  <cachedir>/tmp/ocrwatch-fontconfig-cache</cachedir>
  <alias><family>serif</family><prefer><family>DejaVu Serif</family></prefer></alias>
  <alias><family>sans-serif</family><prefer><family>DejaVu Sans</family></prefer></alias>
  <alias><family>monospace</family><prefer><family>DejaVu Sans Mono</family></prefer></alias>
</fontconfig>
F
"$out/bin/pdftoppm" -v 2>&1 | head -1
du -sh "$out"
