#!/bin/sh
# /init of the interop guest (busybox sh). Built into the initramfs by interop/lab.py.
# Kernel command line: fi.name=vm1 fi.ip=10.77.0.11/24 fi.mtu=1500
# It loads the modules, mounts the 9p shares (jobs: read-write queue; ferroce: the project's
# binaries, read-only), sets up eth0 and rxe0, says "ready", then runs the job queue: every
# /jobs/N.job is renamed N.run and run by sh in its own session; stdout+stderr go to N.out, the
# exit status to N.rc, the session's id to N.pid.
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /tmp /run /jobs /ferroce /root
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp

name=vm ip= mtu=1500
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        fi.name=*) name=${arg#fi.name=} ;;
        fi.ip=*) ip=${arg#fi.ip=} ;;
        fi.mtu=*) mtu=${arg#fi.mtu=} ;;
    esac
done
hostname "$name"

kver=$(uname -r)
while read -r mod; do
    insmod "/lib/modules/$kver/$mod" 2>/dev/null
done < /etc/interop-modules

fail() {
    echo "init: $*" > /dev/console
    echo "$*" > /jobs/failed 2>/dev/null
    poweroff -f
}

mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 jobs /jobs || fail "cannot mount the job share"
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 ferroce /ferroce || fail "cannot mount the ferroce share"
# The ferroce binary runs from the guest's memory, as rxe's tools do: run from the share, its
# first packet paid a 9p round trip for each page of code it touched first (tens of ms under
# emulation).
mkdir -p /usr/local/bin && cp /ferroce/ferroce /usr/local/bin/ferroce || fail "cannot copy the ferroce binary"

ip link set lo up
[ -n "$ip" ] || fail "no fi.ip= on the kernel command line"
ip addr add "$ip" dev eth0 || fail "no eth0 (virtio-net did not load?)"
ip link set eth0 mtu "$mtu" up || fail "cannot bring eth0 up"
rxe-up || fail "rxe0 did not come up"

{
    echo "name=$name ip=$ip kernel=$kver"
    cat /sys/class/infiniband/rxe0/ports/1/gids/1
} > /jobs/ready.tmp && mv /jobs/ready.tmp /jobs/ready

# The queue's pause is a read with a timeout on a FIFO nobody writes to, a shell builtin: a
# `usleep` forked and exec'd a process 25 times a second, and under TCG that and the loop took
# about a sixth of the guest's one CPU, beside the program a job measures (BENCHMARKS.md).
mkfifo /run/tick || fail "cannot make /run/tick"
cd /jobs
while :; do
    for job in *.job; do
        [ -e "$job" ] || continue
        id=${job%.job}
        mv "$job" "$id.run"
        (
            setsid sh "/jobs/$id.run" > "/jobs/$id.out" 2>&1 < /dev/null &
            echo $! > "/jobs/$id.pid"
            wait $!
            echo $? > "/jobs/$id.rc.tmp"
            mv "/jobs/$id.rc.tmp" "/jobs/$id.rc"
        ) &
    done
    [ -e /jobs/poweroff ] && poweroff -f
    read -r -t 0.04 _ <> /run/tick
done
