# Helpers for scripts/setup.sh (sourced; bash): wait for the package manager's locks, retry
# downloads. tests/test_setup_lib.py runs them against locks it holds itself.
#
#   wait_for_apt_locks          wait (at most $VERIFY_APT_LOCK_WAIT seconds, default 600) until
#                               no process holds dpkg's or apt's locks, saying who holds which
#   retry CMD ARGS...           run CMD up to $VERIFY_SETUP_TRIES times (default 3), pausing
#                               $VERIFY_SETUP_RETRY_DELAY s (default 10), then twice that, ...
#
# Locks are found in /proc/locks by the lock file's inode: that sees dpkg's and apt's fcntl
# locks and flock(1)'s alike, needs neither root nor psmisc, and names the holder's pid. A fresh
# VM whose unattended upgrades are running holds them for minutes.

APT_LOCKS=${VERIFY_APT_LOCKS:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}

# The pid holding a lock on FILE, or nothing.
lock_holder() {
  local file=$1 ino
  [ -e "$file" ] || return 0
  ino=$(stat -c %i -- "$file" 2>/dev/null) || return 0
  # "N: POSIX ADVISORY WRITE PID MAJ:MIN:INODE START END"; "N: -> ..." lines are waiters
  awk -v ino="$ino" '$2 != "->" { n = split($6, f, ":"); if (f[n] == ino) { print $5; exit } }' \
    /proc/locks 2>/dev/null
}

# "PID (COMMAND)" for a pid, as far as /proc tells.
describe_pid() {
  local comm
  comm=$(cat "/proc/$1/comm" 2>/dev/null || true)
  if [ -n "$comm" ]; then echo "$1 ($comm)"; else echo "$1"; fi
}

wait_for_apt_locks() {
  local limit=${VERIFY_APT_LOCK_WAIT:-600} waited=0 step=${VERIFY_APT_LOCK_POLL:-5}
  local file pid busy said=""
  while :; do
    busy=""
    for file in $APT_LOCKS; do
      pid=$(lock_holder "$file")
      if [ -n "$pid" ]; then
        busy="$file held by process $(describe_pid "$pid")"
        break
      fi
    done
    if [ -z "$busy" ]; then
      [ -n "$said" ] && echo "setup: the package manager's locks are free after ${waited} s" >&2
      return 0
    fi
    if [ "$waited" -ge "$limit" ]; then
      echo "setup: error: gave up after ${limit} s waiting for $busy (another apt or dpkg," \
           "e.g. unattended upgrades, is still running; wait for it or set" \
           "VERIFY_APT_LOCK_WAIT=SECONDS)" >&2
      return 1
    fi
    if [ "$busy" != "$said" ]; then
      echo "setup: waiting for $busy (up to $((limit - waited)) s more)" >&2
      said=$busy
    fi
    sleep "$step"
    waited=$((waited + step))
  done
}

retry() {
  local tries=${VERIFY_SETUP_TRIES:-3} delay=${VERIFY_SETUP_RETRY_DELAY:-10} n=1 status
  while :; do
    status=0
    "$@" || status=$?
    [ "$status" = 0 ] && return 0
    if [ "$n" -ge "$tries" ]; then
      echo "setup: error: '$*' failed $n time(s) (exit $status); giving up" >&2
      return "$status"
    fi
    echo "setup: '$*' failed (exit $status); try $((n + 1)) of $tries in ${delay} s" >&2
    sleep "$delay"
    delay=$((delay * 2))
    n=$((n + 1))
  done
}

# apt-get with the locks waited for first, and apt's own wait as a second line (apt >= 1.9.11
# honours DPkg::Lock::Timeout; older ones ignore the option).
apt_get() {
  wait_for_apt_locks || return 1
  ${sudo:-} env DEBIAN_FRONTEND=noninteractive apt-get \
    -o DPkg::Lock::Timeout="${VERIFY_APT_LOCK_WAIT:-600}" "$@"
}
