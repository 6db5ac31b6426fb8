# Pareto plot: next-token accuracy lost against exact (points) vs wire
# bits/value, tp 3, one point per codec x G, without (int4) and with (echo)
# error feedback; error bars: the paired difference's standard error.
# gnuplot -e "dat='build/accuracy/plot.dat'; out='docs/accuracy.png'" scripts/accuracy.gp
set terminal pngcairo size 960,560 font ",11"
set output out
set title "SmolLM2-135M-Instruct, tp 3: next-token accuracy vs exact against wire cost (held-out text)"
set xlabel "wire bits per value (codes + scales; codecs at the same cost drawn side by side)"
set ylabel "accuracy change vs exact (points)"
set key bottom right
set grid
set xrange [3.95:5.15]
set yrange [*:1.6]
set arrow from 4.5, graph 0 to 4.5, graph 1 nohead dt 3 lc rgb "gray40"
plot dat using ($4 == 0 ? $1 : 1/0):2:3 with yerrorbars pt 7 ps 1.2 lc rgb "#1f77b4" title "int4 (no feedback)", \
     dat using ($4 == 1 ? $1 : 1/0):2:3 with yerrorbars pt 5 ps 1.2 lc rgb "#d62728" title "echo (error feedback)", \
     dat using ($4 == 1 ? $1 : 1/0):2:5 with labels rotate by 90 offset 0,1.2 left font ",8" notitle, \
     -0.4 with lines lc rgb "red" dt 2 title "paper's bound: -0.4 pt"
