# TTFT per setup (docs/network.md, "Side by side with llama.cpp's RPC
# backend"): one cluster of bars per (file, tp, link, prompt), one bar per
# setup (echo's all-reduce and overlap, llama.cpp's -sm mode), the median
# over runs. Written by scripts/bench-vs-llamacpp-rpc.sh --summary FILE --plot PNG:
# gnuplot -e "dat='PNG.dat'; out='PNG'; n=COLUMNS" scripts/vs-llamacpp-rpc.gp
set terminal pngcairo size 1400,640 font ",10"
set output out
set title "echo under mpirun vs llama.cpp RPC, one rank / ggml-rpc-server per lab host: time to first token"
set ylabel "TTFT (s), lower is better"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside right top
set grid ytics
set yrange [0:*]
set xtics rotate by -25 left font ",9"
set datafile missing "?"
plot for [i=2:n+1] dat using i:xtic(1) title columnheader(i)
