# proc.sh — process helpers the local scripts share (sourced, not run): infra.sh, rcluster.sh,
# gateway.sh and svc.sh record their daemons as "pid starttime" and check them through /proc.

# True if PID exists and is not a zombie. PID 1 here does not always reap orphans, so kill -0
# alone would report dead daemons as alive (and it fails with EPERM on other users'
# processes, which /proc does not).
pid_alive() {
    local pid=${1:-} st
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    st=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [ "${st%% *}" != Z ]
}

# Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat): with the pid it
# names one process, even once the number is used again.
pid_starttime() {
    local st f
    st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    read -r -a f <<<"$st"
    echo "${f[19]}"
}
