"""Starting torch ranks as plain processes for the loom_torch tests: a free
port, the launch environment of torchrun (MASTER_ADDR/PORT, RANK,
WORLD_SIZE, LOCAL_RANK), a deadline, and no process left behind."""
import os
import signal
import socket
import subprocess
import sys
import time

SKIP = 77  # ctest SKIP_RETURN_CODE


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_env(package_dir, extra=None):
    """The environment every rank gets: the package on PYTHONPATH, host
    mode, no CUDA probing, quiet torch."""
    env = dict(os.environ)
    env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    env["LOOM_DEVICE"] = "host"
    env["CUDA_VISIBLE_DEVICES"] = ""
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def run_ranks(cmd, nranks, env, timeout, per_rank_env=None):
    """Runs `cmd` once per rank with torchrun's variables set; returns
    [(returncode, output)] per rank. A rank still running at the deadline is
    killed (with its process group) and reported with returncode None."""
    port = free_port()
    procs = []
    for r in range(nranks):
        e = dict(env)
        e.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(nranks),
                 LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(nranks))
        if per_rank_env:
            e.update(per_rank_env(r))
        procs.append(subprocess.Popen(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      start_new_session=True, text=True))
    return collect(procs, timeout)


def collect(procs, timeout):
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            kill_group(p)
            out, _ = p.communicate()
            results.append((None, out))
    for p in procs:
        kill_group(p)
    return results


def run_launcher(cmd, env, timeout):
    """Runs a launcher (torchrun, mpirun) that starts the ranks itself."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                         text=True)
    return collect([p], timeout)[0]


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def report(results, what):
    """Prints every rank's output; returns True when all exited 0."""
    ok = True
    for r, (rc, out) in enumerate(results):
        status = "timed out" if rc is None else f"exit {rc}"
        if rc != 0:
            ok = False
        print(f"---- {what}: rank {r}: {status}")
        sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
    return ok
