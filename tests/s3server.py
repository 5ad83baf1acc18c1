"""Real S3 servers for the tests, on loopback only: moto's standalone server (from the
package index, works offline) and, where the machine has Ceph's packages, a one-node
Ceph cluster with its RADOS gateway (tests/ceph_rgw.py). Nothing here mocks a call:
the store talks HTTP to a server that stores objects.

moto's conditional PUT checks whether the key exists, then writes it, in two steps of
a threaded server: a race on moto proves the client (a 412 is "already published",
every writer ends with an answer), not the server's atomicity."""

import os
import socket
import subprocess
import sys
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
