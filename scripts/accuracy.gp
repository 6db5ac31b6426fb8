# Next-token accuracy lost against exact (points) vs group size, tp 3.
# gnuplot -e "dat='build/accuracy/plot.dat'; out='docs/accuracy.png'" scripts/accuracy.gp
set terminal pngcairo size 900,520 font ",11"
set output out
set title "SmolLM2-135M-Instruct, tp 3: next-token accuracy vs exact (held-out text)"
set xlabel "values per scale group G"
set ylabel "accuracy change vs exact (points)"
set logscale x 2
set xtics (32, 64, 128)
set key bottom right
set grid
set yrange [*:0.5]
f(x) = -0.4
plot dat using 1:2 with linespoints lw 2 title "int4", \
     dat using 1:3 with linespoints lw 2 title "echo", \
     dat using 1:4 with linespoints lw 2 dt 2 title "int4, min 256 KiB exact", \
     dat using 1:5 with linespoints lw 2 dt 2 title "echo, min 256 KiB exact", \
     f(x) with lines lc rgb "red" dt 3 title "paper's bound: -0.4 pt"
