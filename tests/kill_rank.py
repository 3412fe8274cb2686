"""SIGKILL one process of an `mpiexec -np 3` kvmap job: the whole job must end with a
non-zero exit status within 30 seconds (no rank may hang in a collective)."""
import os
import signal
import subprocess
import sys
import tempfile
import time

launcher = sys.argv[1:-1]  # mpiexec and its flags, then the victim program
victim = sys.argv[-1]
with tempfile.TemporaryDirectory() as d:
    job = subprocess.Popen(launcher + [victim, d], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    pidfile = os.path.join(d, "rank1.pid")
    while not (os.path.exists(pidfile) and os.path.getsize(pidfile) > 0):
        if job.poll() is not None or time.time() > deadline:
            sys.exit("kill_rank: the job ended or stalled before rank 1 started (rc=%s)" % job.poll())
        time.sleep(0.1)
    time.sleep(2.0)  # let the ranks get busy in collectives
    pid = int(open(pidfile).read())
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        rc = job.wait(timeout=30)
    except subprocess.TimeoutExpired:
        job.kill()
        sys.exit("kill_rank: the job did not end within 30 s of SIGKILL to rank 1 (pid %d)" % pid)
    elapsed = time.time() - killed_at
    if rc == 0:
        sys.exit("kill_rank: the job exited with status 0 although rank 1 was killed")
    print("kill_rank: rank 1 (pid %d) killed; job ended with status %d after %.1f s" % (pid, rc, elapsed))
