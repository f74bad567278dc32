#!/bin/sh
# Regenerates the golden inputs in pytrace/testdata from real Python processes.
# Run from pytrace/testdata:  sh gen/gen.sh
# Needs Debian's /usr/bin/python3 (3.11, torch 1.13 with gloo) and, for the
# 3.12/3.13 variants, pyenv's interpreters. Thread IDs, ports and temp paths
# differ from run to run; the tests only rely on the structure.
set -u
P=/usr/bin/python3
PY312=/root/.pyenv/versions/3.12.1/bin/python3
PY313=/root/.pyenv/versions/3.13.0/bin/python3

# Blocked ranks dumped from outside with SIGRTMIN+3 (faulthandler.register).
timeout 60 $P gen/drive_blocked.py blocked_lock_py311 $P lock --twice
timeout 60 $P gen/drive_blocked.py blocked_fifo_py311 $P fifo
timeout 120 $P gen/drive_blocked.py blocked_gloo_py311 $P gloo
timeout 60 $P gen/drive_blocked.py blocked_deep_py311 $P deep
timeout 60 $P gen/drive_blocked.py blocked_lock_py312 $PY312 lock
timeout 60 $P gen/drive_blocked.py blocked_lock_py313 $PY313 lock

# Fatal errors (faulthandler.enable / -X faulthandler).
$P -X faulthandler -c 'import ctypes; ctypes.string_at(0)' 2> fatal_segv_oneliner_py311.txt
$P gen/fatal.py segv torch 2> fatal_segv_torch_py311.txt
$P gen/fatal.py abort 2> fatal_abort_py311.txt
$P gen/fatal.py fpe 2> fatal_fpe_py311.txt
$P gen/fatal.py bus 2> fatal_bus_py311.txt
$PY312 gen/fatal.py segv 2> fatal_segv_py312.txt
$PY313 gen/fatal.py abort 2> fatal_abort_py313.txt
$P gen/misc_dumps.py fatalerror 2> fatal_pyfatalerror_py311.txt
$PY313 gen/misc_dumps.py fatalerror 2> fatal_pyfatalerror_py313.txt

# Other dumps.
$P gen/misc_dumps.py stack 2> dump_stack_py311.txt
$PY313 gen/misc_dumps.py stack 2> dump_stack_py313.txt
$P gen/misc_dumps.py later 2> dump_later_py311.txt
$P gen/misc_dumps.py many 2> dump_many_threads_py311.txt

# Tracebacks.
for m in forward progress context cause group syntax multiline keyboard recursion untraced dataloader; do
	timeout 120 $P gen/tracebacks.py $m 2> tb_${m}_py311.txt
done
$PY313 gen/tracebacks.py cause 2> tb_cause_py313.txt
$PY313 gen/tracebacks.py group 2> tb_group_py313.txt
rm -rf /tmp/pytrace-syn-*

# A gloo peer that exits during all_reduce: rank 0's stderr, and both ranks
# through torch.distributed.elastic's tee ("[default0]:" prefixes).
(timeout 90 $P gen/gloo_exit.py 0 29741 2> tb_gloo_peer_exit_rank0_py311.txt &
	timeout 90 $P gen/gloo_exit.py 1 29741; wait)
timeout 120 $P gen/tee_ranks.py 29761 > tee_gloo_peer_exit_console_py311.txt 2>&1
rm -rf /tmp/pytrace-tee-*

# Debian's torchrun 1.13 failing on --tee under Python 3.11: a long traceback
# entirely inside torch (console output of the launcher).
timeout 120 /usr/bin/torchrun --nproc_per_node 2 --tee 3 --master_port 29751 gen/gloo_exit.py > tb_torchrun_internal_py311.txt 2>&1
exit 0
