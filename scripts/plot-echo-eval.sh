#!/usr/bin/env bash
# Regenerates the error-vs-depth table and docs/echo-eval-depth.png of
# docs/echo.md: echo-eval on the 36-layer fixture at tp 4, then gnuplot.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/echo-eval-depth.png}
make -s bin/echo-eval
bin/echo-eval --model tests/fixtures/models/deep36 --tp 4 --modes echo-nofb,echo --random-prompts 8 --prompt-len 32 --gen-tokens 32 \
  | tee build/echo-eval-deep36.txt
awk '/^[0-9]/ {print $1, $2, $3}' build/echo-eval-deep36.txt > build/echo-eval-deep36.dat
gnuplot -e "set terminal pngcairo size 800,450 noenhanced; set output '$out';
  set title 'deep36 fixture, tp 4: residual-stream error after each layer (8 prompts x 32 tokens)';
  set xlabel 'layer'; set ylabel '||h_mode - h_exact|| / ||h_exact||'; set key left top; set grid;
  plot 'build/echo-eval-deep36.dat' using 1:2 with linespoints title 'echo-nofb (no feedback)', '' using 1:3 with linespoints title 'echo'"
echo "wrote $out"
