#!/bin/bash
# docker-slurm entrypoint: one image, three roles.
#   entrypoint.sh db           munged + MariaDB + slurmdbd (accounting: what sacct reads)
#   entrypoint.sh controller   munged + slurmctld (waits until slurmdbd answers)
#   entrypoint.sh node         munged + slurmd (NodeName = the container's hostname)
#   entrypoint.sh render [FILE]  print the slurm.conf (or cgroup.conf, slurmdbd.conf) this
#                              environment gives, and exit
# Environment (must be the same in every container of a cluster, so all read one slurm.conf):
#   DOCKER_SLURM_PROFILE       fast (CI timings) | site (Slurm's defaults)   default: fast
#   DOCKER_SLURM_TRACKING      linuxproc | cgroup (process tracking)         default: the profile's
#   DOCKER_SLURM_CGROUP        autodetect | cgroup/v1 | cgroup/v2 (cgroup tracking) default: autodetect
#   DOCKER_SLURM_CONTROLLER    hostname of the controller container          default: ctl
#   DOCKER_SLURM_DBD           hostname of the slurmdbd container            default: db
#   DOCKER_SLURM_NODES         NodeName hostlist of the node containers      default: c[1-3]
#   DOCKER_SLURM_NODE_CPUS     CPUs each node declares                       default: 2
#   DOCKER_SLURM_CLUSTER_NAME  ClusterName                                   default: docker
#   DOCKER_SLURM_KEY_DIR       a directory shared by the cluster's containers default: /run/munge-key
# The munge key is never in the image: the driver (tests/testbed/cluster.py) writes
# $DOCKER_SLURM_KEY_DIR/munge.key before the cluster starts; without one (compose), the db
# container makes it there and the others wait for it.
# Cgroup tracking needs the node container in its own cgroup namespace (docker run
# --cgroupns=private, compose `cgroup: private`) with CAP_SYS_ADMIN: docker mounts the
# container's cgroup filesystems read-only, and the entrypoint makes that container's own
# mounts writable (a per-mount flag in its mount namespace; the host's mounts are untouched).
set -euo pipefail

role="${1:-node}"
conf_dir=/etc/docker-slurm
key_dir="${DOCKER_SLURM_KEY_DIR:-/run/munge-key}"
log() { echo "docker-slurm[$role]: $*" >&2; }

load_profile() {
  local profile="${DOCKER_SLURM_PROFILE:-fast}" env="$conf_dir/profile-${DOCKER_SLURM_PROFILE:-fast}.env"
  if [ ! -f "$env" ]; then
    log "unknown DOCKER_SLURM_PROFILE=$profile (have: $(cd "$conf_dir" && ls profile-*.env | sed 's/profile-//;s/.env//' | xargs))"
    exit 2
  fi
  # shellcheck disable=SC1090
  . "$env"
  PROFILE="$profile"
  TRACKING="${DOCKER_SLURM_TRACKING:-$TRACKING}"
  case "$TRACKING" in
    linuxproc) PROCTRACK_TYPE=proctrack/linuxproc TASK_PLUGIN=task/none ;;
    cgroup) PROCTRACK_TYPE=proctrack/cgroup TASK_PLUGIN=task/cgroup,task/affinity ;;
    *) log "unknown DOCKER_SLURM_TRACKING=$TRACKING (linuxproc, cgroup)"; exit 2 ;;
  esac
  CGROUP_PLUGIN="${DOCKER_SLURM_CGROUP:-autodetect}"
  case "$CGROUP_PLUGIN" in
    autodetect|cgroup/v1|cgroup/v2) ;;
    *) log "unknown DOCKER_SLURM_CGROUP=$CGROUP_PLUGIN (autodetect, cgroup/v1, cgroup/v2)"; exit 2 ;;
  esac
}

render_conf() {
  local sched_line="# SchedulerParameters: Slurm's defaults" ctld_line="# SlurmctldParameters: Slurm's defaults"
  [ -z "${SCHEDULER_PARAMETERS:-}" ] || sched_line="SchedulerParameters=$SCHEDULER_PARAMETERS"
  # enable_expedited_requeue exists from 25.11 on (older slurmctld would refuse the word)
  local v; v="$(slurmd -V 2>/dev/null | awk '{print $2}')"
  if [ -n "$v" ] && [ "$(printf '%s\n25.11\n' "${v%.*}" | sort -V | head -1)" = 25.11 ]; then
    ctld_line="SlurmctldParameters=enable_expedited_requeue"
  fi
  sed -e "s|@PROFILE@|$PROFILE|g" \
      -e "s|@TRACKING@|$TRACKING|g" \
      -e "s|@PROCTRACK_TYPE@|$PROCTRACK_TYPE|g" \
      -e "s|@TASK_PLUGIN@|$TASK_PLUGIN|g" \
      -e "s|@CGROUP_PLUGIN@|$CGROUP_PLUGIN|g" \
      -e "s|@CLUSTER_NAME@|${DOCKER_SLURM_CLUSTER_NAME:-docker}|g" \
      -e "s|@CONTROLLER@|${DOCKER_SLURM_CONTROLLER:-ctl}|g" \
      -e "s|@DBD_HOST@|${DOCKER_SLURM_DBD:-db}|g" \
      -e "s|@NODES@|${DOCKER_SLURM_NODES:-c[1-3]}|g" \
      -e "s|@NODE_CPUS@|${DOCKER_SLURM_NODE_CPUS:-2}|g" \
      -e "s|@KILL_WAIT@|$KILL_WAIT|g" \
      -e "s|@GRACE_TIME@|$GRACE_TIME|g" \
      -e "s|@SLURMD_TIMEOUT@|$SLURMD_TIMEOUT|g" \
      -e "s|@SLURMCTLD_TIMEOUT@|$SLURMCTLD_TIMEOUT|g" \
      -e "s|@MESSAGE_TIMEOUT@|$MESSAGE_TIMEOUT|g" \
      -e "s|@UNKILLABLE_STEP_TIMEOUT@|$UNKILLABLE_STEP_TIMEOUT|g" \
      -e "s|@CRED_EXPIRE@|$CRED_EXPIRE|g" \
      -e "s|@MIN_JOB_AGE@|$MIN_JOB_AGE|g" \
      -e "s|@SCHEDULER_PARAMETERS_LINE@|$sched_line|g" \
      -e "s|@SLURMCTLD_PARAMETERS_LINE@|$ctld_line|g" \
      "$conf_dir/${1:-slurm.conf}.in"
}

# Poll CMD (bounded): the daemons need a moment before they answer.
wait_for() {
  local what="$1" seconds="$2"; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then log "$what did not happen within $seconds s"; return 1; fi
    sleep 0.2
  done
}

load_profile
if [ "$role" = render ]; then render_conf "${2:-slurm.conf}"; exit 0; fi
case "$role" in db|controller|node) ;; *) log "usage: entrypoint.sh db|controller|node|render [FILE]"; exit 2 ;; esac

# 1. The munge key, shared by every container of this cluster.
mkdir -p "$key_dir"
if [ ! -s "$key_dir/munge.key" ]; then
  if [ "$role" = db ]; then
    log "no munge key in $key_dir: making one"
    (umask 077 && dd if=/dev/urandom of="$key_dir/munge.key.new" bs=1024 count=1 status=none &&
       mv "$key_dir/munge.key.new" "$key_dir/munge.key")
  else
    wait_for "a munge key in $key_dir" 120 test -s "$key_dir/munge.key" || exit 1
  fi
fi
install -o munge -g munge -m 0400 "$key_dir/munge.key" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- /usr/sbin/munged --force
wait_for "munged answering" 20 munge -n </dev/null

# 2. slurm.conf (and cgroup.conf), the same everywhere.
render_conf >/etc/slurm/slurm.conf
render_conf cgroup.conf >/etc/slurm/cgroup.conf
chmod 0644 /etc/slurm/slurm.conf /etc/slurm/cgroup.conf

# 3. The shared checkpoint volume: every user may create their own folders there.
if [ -d /checkpoints ]; then chmod 1777 /checkpoints; fi

# 4. The daemon, in the foreground (PID 1 is docker's init, which reaps orphans).
if [ "$role" = db ]; then
  render_conf slurmdbd.conf >/etc/slurm/slurmdbd.conf
  chown slurm:slurm /etc/slurm/slurmdbd.conf
  chmod 0600 /etc/slurm/slurmdbd.conf
  install -d -o slurm -g slurm /run/slurmdbd
  # Where this suite's MariaDB keeps its data and socket (/var/lib/mysql or, from sid on,
  # /var/lib/mariadb; /run/mysqld or /run/mariadbd).
  mariadb_opt() { runuser -u mysql -- mariadbd --help --verbose 2>/dev/null | awk -v k="$1" '$1 == k && NF == 2 {print $2}'; }
  datadir="$(mariadb_opt datadir)" socket="$(mariadb_opt socket)"
  install -d -o mysql -g mysql "$(dirname "$socket")"
  [ -d "$datadir/mysql" ] || mariadb-install-db --user=mysql --skip-test-db >/dev/null
  log "starting MariaDB ($(mariadbd --version | awk '{print $3}'), data in $datadir)"
  runuser -u mysql -- mariadbd >/var/log/mariadb.log 2>&1 &
  wait_for "MariaDB answering" 60 mariadb -e 'select 1' || { tail -20 /var/log/mariadb.log >&2; exit 1; }
  # The database is made here, not by slurmdbd: slurmdbd connects to it first and, on
  # "Unknown database", creates it and reconnects on the same handle; libmariadb 3.4.10
  # (MariaDB 11.8.9, trixie and sid) then fails every result set on that handle ("Number of
  # columns in result (=1) set execeeds maxmimum allowed number of columns (=0)") and
  # slurmdbd dies at its first query.
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
              CREATE USER IF NOT EXISTS slurm@localhost IDENTIFIED VIA unix_socket;
              GRANT ALL ON slurm_acct_db.* TO slurm@localhost;"
  log "starting slurmdbd ($(slurmdbd -V))"
  exec /usr/sbin/slurmdbd -D
elif [ "$role" = controller ]; then
  install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld
  # Jobs are recorded from the first one on: slurmctld starts once slurmdbd answers (it
  # registers the cluster there itself).
  wait_for "slurmdbd on ${DOCKER_SLURM_DBD:-db} answering" 180 sacctmgr -n list cluster || exit 1
  log "starting slurmctld ($(slurmctld -V)), profile $PROFILE, tracking $TRACKING"
  exec /usr/sbin/slurmctld -D
else
  install -d -m 0755 /var/lib/slurm/slurmd
  if [ "$TRACKING" = cgroup ]; then
    if grep -qv '::*/$' /proc/self/cgroup; then
      log "cgroup tracking needs a private cgroup namespace (docker run --cgroupns=private); this container sees: $(tr '\n' ' ' </proc/self/cgroup)"
      exit 2
    fi
    awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/mounts | while read -r m; do
      mount -o remount,bind,rw "$m" || { log "cannot make $m writable: the node needs CAP_SYS_ADMIN"; exit 2; }
    done
    log "cgroup tracking: /sys/fs/cgroup is $(stat -f -c %T /sys/fs/cgroup/), CgroupPlugin=$CGROUP_PLUGIN"
  fi
  log "starting slurmd as $(hostname) ($(slurmd -V)), profile $PROFILE, tracking $TRACKING"
  exec /usr/sbin/slurmd -D
fi
