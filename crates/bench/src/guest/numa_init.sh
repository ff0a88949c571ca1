# The two-node NUMA guest (crates/bench/src/guest/numa.rs): scenarios follow.
MIB=@MIB@
DELAY=@DELAY@
RUN=@RUN@
KSM=/sys/kernel/mm/ksm
mkdir -p /run && mount -t tmpfs -o mode=0755 run /run || fail "mounting /run"
cp -a /payload/. / || fail "installing pagesift and its libraries"
# The initramfs stores payload files 0644: the binary and the loader must run.
(cd /payload && find . -type f) | (cd / && xargs chmod 755) || fail "chmod"
ln -s @PAGESIFT@ /bin/pagesift || fail "linking /bin/pagesift"
pagesift --version > /dev/null 2>&1 || fail "pagesift does not run in the guest: $(pagesift --version 2>&1 | head -n 3)"
# The classic LRU, whose active list KPF_ACTIVE shows.
[ -w /sys/kernel/mm/lru_gen/enabled ] && echo n > /sys/kernel/mm/lru_gen/enabled
echo "numa-guest: nodes=$(cat /sys/devices/system/node/online) cpus=$(cat /sys/devices/system/cpu/online) kernel=$(uname -r) merge_across_nodes=$(cat $KSM/merge_across_nodes)"

# Waits for the first line of $1 (a workload's report).
first_line() {
    i=0
    while ! grep -q '"pid"' "$1" 2>/dev/null; do
        i=$((i + 1))
        [ $i -le 1200 ] || fail "no report in $1: $(cat "$1" "$1.err" 2>/dev/null | head -n 5)"
        sleep 0.1
    done
}
pid_of() { sed -n 's/.*"pid":\([0-9]*\).*/\1/p' "$1" | head -n 1; }
sums() { sed -n 's/.*"checksum":"\([0-9a-fx]*\)".*/\1/p' "$1"; }

# hint_overhead MIB: the I/O hint program's cost under each hook, over a
# cached file of MIB MiB in /run (tmpfs).
hint_overhead() {
    for hook in fexit sys-exit; do
        echo "numa-guest: hint overhead ($hook) at $(cut -d' ' -f1 /proc/uptime) s"
        if pagesift hint-overhead --dir /run/ho --mib "$1" --hook $hook --json > /run/ho.out 2> /run/ho.err; then
            while read -r line; do echo "numa-hints $hook $line"; done < /run/ho.out
        else
            echo "numa-hints-failed $hook $(tail -n 3 /run/ho.err | tr '\n' ' ')"
        fi
    done
    rm -rf /run/ho
}

# scenario NAME ksm|fair|priority NICE0 NICE1
scenario() {
    name=$1
    mode=$2
    echo "numa-guest: scenario $name ($mode, nice $3 and $4) at $(cut -d' ' -f1 /proc/uptime) s"
    rm -f /run/a.in /run/b.in /run/a.out /run/b.out
    mkfifo /run/a.in /run/b.in || fail "mkfifo"
    exec 3<>/run/a.in 4<>/run/b.in
    pre=""
    [ "$mode" = ksm ] && pre="pagesift exec --"
    $pre pagesift workload random --mib $MIB --seed 7 --node 0 --nice $3 <&3 > /run/a.out 2> /run/a.out.err &
    first_line /run/a.out
    sleep $DELAY
    $pre pagesift workload random --mib $MIB --seed 7 --node 1 --nice $4 <&4 > /run/b.out 2> /run/b.out.err &
    first_line /run/b.out
    A=$(pid_of /run/a.out)
    B=$(pid_of /run/b.out)
    if [ "$mode" = ksm ]; then
        echo 1000 > $KSM/pages_to_scan
        echo 20 > $KSM/sleep_millisecs
        echo 1 > $KSM/run
        sleep $RUN
        echo 0 > $KSM/run
    else
        printf '[numa]\npolicy = "%s"\n' "$mode" > /run/numa.toml
        pagesift run --config /run/numa.toml --pid $A --pid $B --for $RUN --socket /run/ps.sock > /run/d.log 2>&1 &
        D=$!
        sleep $((RUN - 4))
        echo "numa-status $name $(pagesift status --json --socket /run/ps.sock | tr -d '\n')"
        wait $D || { tail -n 20 /run/d.log; fail "pagesift run failed in $name"; }
    fi
    echo "numa-census $name 0 $(pagesift numa --json $A)"
    echo "numa-census $name 1 $(pagesift numa --json $B)"
    echo "numa-saving $name pages_sharing=$(cat $KSM/pages_sharing) pages_shared=$(cat $KSM/pages_shared)"
    echo checksum >&3
    echo checksum >&4
    i=0
    while [ "$(sums /run/a.out | wc -l)" -lt 2 ] || [ "$(sums /run/b.out | wc -l)" -lt 2 ]; do
        i=$((i + 1))
        [ $i -le 600 ] || fail "no checksum answer in $name"
        sleep 0.1
    done
    va=changed
    vb=changed
    [ "$(sums /run/a.out | head -n 1)" = "$(sums /run/a.out | tail -n 1)" ] && va=ok
    [ "$(sums /run/b.out | head -n 1)" = "$(sums /run/b.out | tail -n 1)" ] && vb=ok
    kill $A $B
    wait
    exec 3>&- 4>&-
    echo "numa-checksum $name 0=$va 1=$vb"
}

