"""A fault on the last rank after the agreement of every collective entry point: the whole
job must end (MPI_Abort) with a non-zero status and kvmap's message naming the site, within
60 seconds, never hang. Usage: fault_after.py NPROCS mpiexec [-n NPROCS flags...] program"""
import subprocess
import sys
import time

SITES = [
    "DistView::empty", "DistView::zeros", "DistView::full", "DistView::arange",
    "DistView::from_local", "DistView::from_global", "DistView::scatter",
    "DistView::redistribute", "DistView::resplit", "DistView::balance", "DistView::gather",
    "DistView::allgather", "random::uniform", "random::normal", "manual_seed", "linalg::dot",
    "linalg::nrm2", "linalg::axpby", "vmap",
]

nprocs = int(sys.argv[1])
launcher, program = sys.argv[2:-1], sys.argv[-1]
failures = []
for site in SITES:
    start = time.time()
    cmd = launcher + [program, site]
    try:
        job = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except subprocess.TimeoutExpired:
        failures.append("%s: the job did not end within 60 s (a hang)" % site)
        continue
    out = job.stdout.decode(errors="replace")
    expected = "kvmap: %s failed on rank %d after every rank had agreed to run it" % (site, nprocs - 1)
    if job.returncode == 0 or expected not in out or "injected fault at %s (execute)" % site not in out:
        failures.append("%s: status %d, output:\n%s" % (site, job.returncode, out[-2000:]))
    else:
        print("%-24s aborted with status %d in %.1f s" % (site, job.returncode, time.time() - start))
if failures:
    sys.exit("fault_after at %d ranks:\n" % nprocs + "\n".join(failures))
print("fault_after: all %d entry points abort the job at %d ranks" % (len(SITES), nprocs))
