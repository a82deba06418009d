# shellcheck shell=bash
# Sourced by up.sh and down.sh: the pid files of the services `make up` starts, and how a pid
# is told to be ours before it is signalled.
#
# A pid file holds "PID STARTTIME" (the process' start time in clock ticks since boot, field 22
# of /proc/PID/stat); one from before start times were recorded holds the pid alone. Its name is
# the binary's, with the replica's number in the cluster topology: engine.pid, engine-2.pid.

# shellcheck source=deploy/local/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/proc.sh"

# svc_binary PIDFILE: the binary its process runs, quan-<name> (the replica's -N dropped).
svc_binary() {
    local n
    n=$(basename "$1" .pid)
    echo "quan-${n%-[0-9]}"
}

# svc_ours PIDFILE: prints the pid when it still names the process started for it: alive, not a
# zombie, running that binary, and (when recorded) started when it was.
svc_ours() {
    local pidfile=$1 pid start argv0 bin
    [ -f "$pidfile" ] || return 1
    read -r pid start <"$pidfile" || [ -n "${pid:-}" ] || return 1
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    pid_alive "$pid" || return 1
    argv0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1)
    bin=$(svc_binary "$pidfile")
    [ "$argv0" = "$bin" ] || [[ $argv0 == */"$bin" ]] || return 1
    [ -z "${start:-}" ] || [ "$(pid_starttime "$pid")" = "$start" ] || return 1
    echo "$pid"
}

# svc_running PIDFILE: its process is alive (started when recorded), whatever it runs yet: a
# process just forked may not have reached its exec.
svc_running() {
    local pid start
    read -r pid start <"$1" 2>/dev/null || [ -n "${pid:-}" ] || return 1
    pid_alive "$pid" || return 1
    [ -z "${start:-}" ] || [ "$(pid_starttime "$pid")" = "$start" ]
}

# svc_record PIDFILE PID: written once the process runs.
svc_record() {
    local t
    t=$(pid_starttime "$2") || t=""
    echo "$2${t:+ $t}" >"$1"
}

# svc_stop PIDFILE: SIGTERM (the service drains: up to its shutdown timeout), SIGKILL after
# 30 s, only to the process the file names; the file goes either way.
svc_stop() {
    local pidfile=$1 pid
    if pid=$(svc_ours "$pidfile"); then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 150); do
            svc_ours "$pidfile" >/dev/null || break
            sleep 0.2
        done
        if svc_ours "$pidfile" >/dev/null; then
            echo "$(basename "$pidfile" .pid) (pid $pid) outlived SIGTERM by 30 s; SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "stopped quan-$(basename "$pidfile" .pid) (pid $pid)"
    fi
    rm -f "$pidfile"
}
