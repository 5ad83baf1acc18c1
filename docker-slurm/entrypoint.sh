#!/bin/bash
# docker-slurm entrypoint: one image, two roles.
#   entrypoint.sh controller   munged + slurmctld
#   entrypoint.sh node         munged + slurmd (NodeName = the container's hostname)
#   entrypoint.sh render       print the slurm.conf this environment gives, and exit
# Environment (must be the same in every container of a cluster, so all read one slurm.conf):
#   DOCKER_SLURM_PROFILE       fast (CI timings) | site (Slurm's defaults)   default: fast
#   DOCKER_SLURM_CONTROLLER    hostname of the controller container          default: ctl
#   DOCKER_SLURM_NODES         NodeName hostlist of the node containers      default: c[1-3]
#   DOCKER_SLURM_NODE_CPUS     CPUs each node declares                       default: 2
#   DOCKER_SLURM_CLUSTER_NAME  ClusterName                                   default: docker
#   DOCKER_SLURM_KEY_DIR       a directory shared by the cluster's containers default: /run/munge-key
# The munge key is never in the image: the driver (tests/testbed/cluster.py) writes
# $DOCKER_SLURM_KEY_DIR/munge.key before the cluster starts; without one (compose), the controller
# makes it there and the nodes wait for it.
set -euo pipefail

role="${1:-node}"
conf_dir=/etc/docker-slurm
key_dir="${DOCKER_SLURM_KEY_DIR:-/run/munge-key}"
log() { echo "docker-slurm[$role]: $*" >&2; }

render_conf() {
  local profile="${DOCKER_SLURM_PROFILE:-fast}" env="$conf_dir/profile-${DOCKER_SLURM_PROFILE:-fast}.env"
  if [ ! -f "$env" ]; then
    log "unknown DOCKER_SLURM_PROFILE=$profile (have: $(cd "$conf_dir" && ls profile-*.env | sed 's/profile-//;s/.env//' | xargs))"
    exit 2
  fi
  # shellcheck disable=SC1090
  . "$env"
  local sched_line="# SchedulerParameters: Slurm's defaults"
  [ -z "${SCHEDULER_PARAMETERS:-}" ] || sched_line="SchedulerParameters=$SCHEDULER_PARAMETERS"
  sed -e "s|@PROFILE@|$profile|g" \
      -e "s|@CLUSTER_NAME@|${DOCKER_SLURM_CLUSTER_NAME:-docker}|g" \
      -e "s|@CONTROLLER@|${DOCKER_SLURM_CONTROLLER:-ctl}|g" \
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
      "$conf_dir/slurm.conf.in"
}

if [ "$role" = render ]; then render_conf; exit 0; fi
case "$role" in controller|node) ;; *) log "usage: entrypoint.sh controller|node|render"; exit 2 ;; esac

# 1. The munge key, shared by every container of this cluster.
mkdir -p "$key_dir"
if [ ! -s "$key_dir/munge.key" ]; then
  if [ "$role" = controller ]; then
    log "no munge key in $key_dir: making one"
    (umask 077 && dd if=/dev/urandom of="$key_dir/munge.key.new" bs=1024 count=1 status=none &&
       mv "$key_dir/munge.key.new" "$key_dir/munge.key")
  else
    for _ in $(seq 1 600); do [ -s "$key_dir/munge.key" ] && break; sleep 0.2; done
    [ -s "$key_dir/munge.key" ] || { log "no munge key appeared in $key_dir"; exit 1; }
  fi
fi
install -o munge -g munge -m 0400 "$key_dir/munge.key" /etc/munge/munge.key
install -d -o munge -g munge -m 0755 /run/munge
runuser -u munge -- /usr/sbin/munged --force
for _ in $(seq 1 100); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done

# 2. slurm.conf, the same everywhere.
render_conf >/etc/slurm/slurm.conf
chmod 0644 /etc/slurm/slurm.conf

# 3. The shared checkpoint volume: every user may create their own folders there.
if [ -d /checkpoints ]; then chmod 1777 /checkpoints; fi

# 4. The daemon, in the foreground (PID 1 is docker's init, which reaps orphans).
if [ "$role" = controller ]; then
  install -d -o slurm -g slurm -m 0755 /var/lib/slurm/slurmctld
  log "starting slurmctld ($(slurmctld -V)), profile ${DOCKER_SLURM_PROFILE:-fast}"
  exec /usr/sbin/slurmctld -D
else
  install -d -m 0755 /var/lib/slurm/slurmd
  log "starting slurmd as $(hostname) ($(slurmd -V)), profile ${DOCKER_SLURM_PROFILE:-fast}"
  exec /usr/sbin/slurmd -D
fi
