"""The monitor's CPU figures: the tree's total from wait4, split into the root and its children."""

import sys

from bench.monitor import run_monitored

# the root burns ~0.1 CPU s, starts a child that burns ~0.6 s, reaps it, then exits
_SCRIPT = """
import subprocess, sys, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
burn(0.1)
subprocess.run([sys.executable, "-c", "import time\\nt=time.process_time()\\n"
                "while time.process_time()-t<0.6: pass"], check=True)
time.sleep(0.3)  # a sample or two after the child was reaped
"""


def test_cpu_is_split_between_the_main_process_and_its_children() -> None:
    rec = run_monitored([sys.executable, "-c", _SCRIPT], timeout=60)
    assert rec.exit_code == 0
    cpu = rec.cpu
    assert len(cpu["children_s"]) == 1
    assert 0.5 <= cpu["children_s"][0] <= 1.0
    assert cpu["total_s"] >= 0.6 + 0.1
    # the child's samples may miss its last interval (longer than 0.1 s under load); what
    # they missed is the reaped CPU they did not see, so the parts add up to the exact total
    parts = cpu["main_s"] + cpu["children_s"][0] + cpu["children_unsampled_s"]
    assert abs(parts - cpu["total_s"]) <= 0.015
    assert cpu["children_s"][0] + cpu["children_unsampled_s"] >= 0.6
    assert 0.05 <= cpu["main_s"] <= cpu["total_s"] - 0.5
