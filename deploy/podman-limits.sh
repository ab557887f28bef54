#!/bin/bash
# Podman's default ulimits within this host's hard limits, once per host (docs/deploy.md).
#
# Podman asks for more open files (and processes) than some hosts' hard limits allow, and runc refuses to
# raise a limit: every `podman run`, `podman build` step and `podman kube play` then fails with "error
# setting rlimit type 7: operation not permitted". This writes `default_ulimits` at those hard limits
# (processes at most 32768) where podman reads it: the file $CONTAINERS_CONF names when it is set (podman
# then reads only that one), else a drop-in of containers.conf.d (root: /etc/containers; others:
# ~/.config/containers). On a host whose limits are high already it changes nothing that matters.
set -eu

cap() {  # a hard limit, "unlimited" or above $2 becoming $2
    if [ "$1" = unlimited ] || [ "$1" -gt "$2" ]; then echo "$2"; else echo "$1"; fi
}
nofile=$(cap "$(ulimit -Hn)" 1048576)
nproc=$(cap "$(ulimit -Hu)" 32768)
case "$nofile$nproc" in *[!0-9]*|"") echo "error: cannot read this host's hard limits (nofile=$nofile nproc=$nproc)" >&2; exit 2;; esac
line="default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"

if [ -n "${CONTAINERS_CONF:-}" ]; then
    conf=$CONTAINERS_CONF
    if grep -q '^default_ulimits' "$conf" 2>/dev/null; then
        echo "$conf: has default_ulimits already; left as it is"
        exit 0
    fi
    if grep -q '^\[containers\]' "$conf" 2>/dev/null; then
        echo "error: $conf: has a [containers] table: add this line to it: $line" >&2
        exit 2
    fi
    printf '\n[containers]\n%s\n' "$line" >> "$conf"
else
    if [ "$(id -u)" = 0 ]; then dir=/etc/containers/containers.conf.d
    else dir=${XDG_CONFIG_HOME:-$HOME/.config}/containers/containers.conf.d; fi
    mkdir -p "$dir"
    conf=$dir/50-assay-limits.conf
    printf '[containers]\n%s\n' "$line" > "$conf"
fi
echo "$conf: $line"
