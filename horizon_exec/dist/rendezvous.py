"""The launcher's rendezvous, checked before any rank starts and bounded by --dist-timeout.

torch.distributed.run, left to itself, retried an unresolvable --master-addr for as long as
it liked (still hanging after 700 s with --dist-timeout 15), let a node whose master is
unreachable hang printing C++ frames, and answered a master port in use with a
DistNetworkError traceback. Here:
- the master address is resolved up front, within the timeout: unresolvable -> exit 2 naming it;
- on the master node (node-rank 0) the port is checked free: in use -> exit 2 naming it (a
  probe bind with SO_REUSEADDR: a listener conflicts, a previous run's TIME_WAIT does not);
- the static rendezvous' own timeout is --dist-timeout (rendezvous_conf), so a master that
  never answers ends the launch after it, one line, exit 1 (launch.py);
- torch's C++ logging is quieted to fatal errors (its retries and errors carry C++ frames; the
  launcher reports the failure itself, in one line) and its C++ stack traces kept out of messages
  (quiet_cpp_logs), unless the user set those variables.
"""
import os
import socket
import threading

from horizon_sim.errors import HorizonError

QUIET_ENV = {"TORCH_CPP_LOG_LEVEL": "FATAL", "TORCH_SHOW_CPP_STACKTRACES": "0",
             "TORCH_DISTRIBUTED_DEBUG": "OFF"}
"""Environment the launcher (and so its ranks) runs with: one-line errors, not C++ frames."""


def quiet_cpp_logs(env=os.environ) -> None:
    for k, v in QUIET_ENV.items():
        env.setdefault(k, v)


def resolve(host: str, port: int, timeout_s: float) -> list:
    """getaddrinfo(host, port) within timeout_s (a resolver that does not answer counts as a
    failure); HorizonError naming the host when it does not resolve."""
    box: dict = {}

    def look():
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            box["err"] = e
    t = threading.Thread(target=look, name="horizon-resolve", daemon=True)
    t.start()
    t.join(timeout_s)
    if "infos" in box:
        return box["infos"]
    why = (f"{getattr(box['err'], 'strerror', None) or box['err']}" if "err" in box
           else f"no answer within --dist-timeout {timeout_s:g} s")
    raise HorizonError(f"--master-addr {host}: cannot resolve it ({why}); give node 0's host name or IP address")


def check_port_free(host: str, port: int, infos: list | None = None) -> None:
    """On the master node: HorizonError naming the port when something listens on it already."""
    families = {i[0] for i in infos} if infos else {socket.AF_INET}
    for fam in families & {socket.AF_INET, socket.AF_INET6}:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:  # the rendezvous store listens on every address: so does the probe
                s.bind(("::" if fam == socket.AF_INET6 else "0.0.0.0", port))
            except OSError as e:
                if fam == socket.AF_INET6 and e.errno != 98:  # no IPv6 here: the IPv4 probe decides
                    continue
                raise HorizonError(f"--master-port {port}: {e.strerror or e} on this node (the master, "
                                   f"{host}): another run or program holds it; pick a free port") from None


def check_rendezvous(master_addr: str, master_port: int, node_rank: int, timeout_s: float) -> None:
    """The up-front checks (module docstring)."""
    infos = resolve(master_addr, master_port, timeout_s)
    if node_rank == 0:
        check_port_free(master_addr, master_port, infos)


def rendezvous_conf(timeout_s: float) -> str:
    """torch.distributed.run's --rdzv-conf: the static rendezvous waits at most --dist-timeout."""
    return f"timeout={max(1, int(round(timeout_s)))}"
