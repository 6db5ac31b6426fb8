# The multi-domain suite's plot (docs/accuracy.md): next-token accuracy change
# against exact (points) vs wire bits/value, tp 3, one point per domain and
# all-reduce (pooled: the large marks), with (echo) and without (echo-nofb,
# int4) error feedback; error bars: the paired standard error. Domains are
# drawn side by side around their codec's cost.
# gnuplot -e "dat='build/accuracy-domains/plot.dat'; out='docs/accuracy-domains.png'" scripts/accuracy-domains.gp
set terminal pngcairo size 1000,600 font ",11"
set output out
set title "SmolLM2-135M-Instruct, tp 3: accuracy change vs exact on five kinds of text"
set xlabel "wire bits per value (domains side by side: prose, reference, code, german, chat, pooled)"
set ylabel "accuracy change vs exact (points)"
set key bottom right
set grid
set xrange [3.2:5.1]
set yrange [-14:1]
x(b, d) = b + (d - 2.5) * 0.035
set arrow from graph 0, first -0.4 to graph 1, first -0.4 nohead dt 2 lc rgb "red"
set arrow from graph 0, first -1.0 to graph 1, first -1.0 nohead dt 3 lc rgb "orange"
plot dat using (x($1,$4)):($5 == 1 && $4 < 5 ? $2 : 1/0):3 with yerrorbars pt 7 ps 0.9 lc rgb "#d62728" title "echo (error feedback), per domain", \
     dat using (x($1,$4)):($5 == 1 && $4 == 5 ? $2 : 1/0):3 with yerrorbars pt 5 ps 1.8 lc rgb "#d62728" title "echo, pooled", \
     dat using (x($1,$4)):($5 == 0 && $4 < 5 ? $2 : 1/0):3 with yerrorbars pt 6 ps 0.9 lc rgb "#1f77b4" title "no feedback (echo-nofb, int4), per domain", \
     dat using (x($1,$4)):($5 == 0 && $4 == 5 ? $2 : 1/0):3 with yerrorbars pt 4 ps 1.8 lc rgb "#1f77b4" title "no feedback, pooled", \
     1/0 with lines dt 2 lc rgb "red" title "-0.4 pt (default's bound)", \
     1/0 with lines dt 3 lc rgb "orange" title "-1.0 pt (3.5-bit preset's bound)"
