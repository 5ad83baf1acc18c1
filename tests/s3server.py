"""Real S3 servers for the tests, on loopback only: moto's standalone server (from the
package index, works offline) and, where the machine has Ceph's packages, a one-node
Ceph cluster with its RADOS gateway (below). Nothing here mocks a call:
the store talks HTTP to a server that stores objects.

moto's conditional PUT checks whether the key exists, then writes it, in two steps of
a threaded server: a race on moto proves the client (a 412 is "already published",
every writer ends with an answer), not the server's atomicity."""

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
import uuid

from testbed import wait

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An S3 endpoint this test run started, its credentials, and whether its
    conditional PUT is atomic (exactly one of racing creators wins)."""

    def __init__(self, name: str, endpoint: str, env: dict, atomic: bool, proc=None):
        self.name, self.endpoint, self.atomic, self.proc = name, endpoint, atomic, proc
        self.env = {**env, "AWS_ENDPOINT_URL_S3": endpoint}

    def client(self):
        import boto3
        return boto3.session.Session(aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
                                     aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
                                     region_name="us-east-1").client("s3", endpoint_url=self.endpoint)

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_moto() -> Server:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, **CREDENTIALS})
    server = Server("moto", f"http://127.0.0.1:{port}", CREDENTIALS, atomic=False, proc=proc)
    try:
        wait.until(lambda: proc.poll() is not None or server.client().list_buckets(), timeout=60,
                   what="moto's S3 server to answer", retry=(Exception,))
        if proc.poll() is not None:
            raise RuntimeError(f"moto's server exited {proc.returncode}")
    except BaseException:
        server.stop()
        raise
    return server


CEPH_CONF = """[global]
fsid = {fsid}
mon_host = v2:127.0.0.1:{mon}
public_addr = 127.0.0.1
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
ms_client_mode = crc
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
osd_pool_default_pg_autoscale_mode = off
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_objectstore = memstore
memstore_device_bytes = 1073741824
run_dir = {d}/run
log_file = {d}/log/$name.log
admin_socket = {d}/run/$name.asok
keyring = {d}/keyring
osd_data = {d}/osd0
mon_data = {d}/mon
client_mount_timeout = 30
[client.rgw]
rgw_frontends = beast endpoint=127.0.0.1:{rgw}
rgw_data = {d}/rgw
"""


class Ceph(Server):
    """A one-node Ceph cluster (a monitor, one in-memory OSD) and its RADOS gateway,
    from Debian's packages, in a temporary folder, on loopback ports, in the foreground
    of processes this test run owns. RGW's conditional PUT ends in an exclusive create
    of the object's head in RADOS: the check and the write are one step on the OSD."""

    def __init__(self, d: str):
        self.d, self.procs = d, []
        ports = {"mon": free_port(), "rgw": free_port()}
        conf = os.path.join(d, "ceph.conf")
        for sub in ("mon", "osd0", "run", "log", "rgw"):
            os.makedirs(os.path.join(d, sub))
        with open(conf, "w") as f:
            f.write(CEPH_CONF.format(fsid=uuid.uuid4(), d=d, **ports))
        self.conf = conf
        super().__init__("ceph-rgw", f"http://127.0.0.1:{ports['rgw']}", CREDENTIALS, atomic=True)
        try:
            self._boot(ports)
        except BaseException:
            self.stop()
            raise

    def _run(self, *args, timeout=120):
        return subprocess.run([*args, "-c", self.conf], check=True, capture_output=True, text=True,
                              timeout=timeout).stdout

    def _daemon(self, *args):
        log = open(os.path.join(self.d, "log", f"{args[0]}.out"), "w")
        self.procs.append(subprocess.Popen([*args, "-f", "-c", self.conf], stdout=log, stderr=log))

    def _boot(self, ports):
        d, fsid = self.d, open(self.conf).read().split("fsid = ")[1].split()[0]
        subprocess.run(["ceph-authtool", "--create-keyring", f"{d}/keyring", "--gen-key", "-n", "mon.",
                        "--cap", "mon", "allow *"], check=True, capture_output=True)
        subprocess.run(["monmaptool", "--create", "--addv", "a", f"[v2:127.0.0.1:{ports['mon']}]", "--fsid", fsid,
                        f"{d}/monmap"], check=True, capture_output=True)
        self._run("ceph-mon", "--mkfs", "-i", "a", "--monmap", f"{d}/monmap", "--keyring", f"{d}/keyring")
        self._daemon("ceph-mon", "-i", "a")
        osd_uuid = str(uuid.uuid4())
        osd_id = self._run("ceph", "--connect-timeout", "60", "osd", "new", osd_uuid).strip()
        self._run("ceph-osd", "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid)
        self._daemon("ceph-osd", "-i", osd_id)
        self._daemon("radosgw", "-n", "client.rgw")
        wait.until(lambda: self._alive() and urllib.request.urlopen(self.endpoint, timeout=5).status == 200,
                   timeout=180,
                   what="Ceph's RADOS gateway to answer", retry=(Exception,), every=1)
        self._run("radosgw-admin", "user", "create", "--uid=test", "--display-name=test",
                  f"--access-key={CREDENTIALS['AWS_ACCESS_KEY_ID']}",
                  f"--secret={CREDENTIALS['AWS_SECRET_ACCESS_KEY']}")

    def _alive(self) -> bool:
        dead = [p.args[0] for p in self.procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{dead} exited; logs in {self.d}/log")
        return True

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def start_ceph(d: str) -> Server | None:
    """Ceph's RGW, or None when this machine has no Ceph packages."""
    if not shutil.which("radosgw"):
        return None
    return Ceph(d)
