// Package pytrace parses what a Python process prints about where it is:
// uncaught-exception tracebacks (to explain why a rank crashed, from the tail
// of its stderr) and faulthandler stack dumps (to tell which rank of a hung
// job is the culprit, from one dump per rank).
//
// It understands two kinds of text, and skips everything else:
//
// Faulthandler dumps, as written by faulthandler.dump_traceback, by a handler
// installed with faulthandler.register(sig, all_threads=True), by
// faulthandler.dump_traceback_later, and by the fatal-error handler
// (faulthandler.enable, python -X faulthandler, PYTHONFAULTHANDLER=1):
//
//	Fatal Python error: Segmentation fault        <- fatal handler only
//	                                              <- blank line
//	Thread 0x00007f1c2b5fe6c0 (most recent call first):
//	  File "/usr/lib/python3.11/threading.py", line 324 in wait
//	  File "/home/u/train.py", line 22 in heartbeat
//
//	Current thread 0x00007f1c2c0a1740 (most recent call first):
//	  File "/home/u/train.py", line 30 in step
//	  File "/home/u/train.py", line 97 in <module>
//
//	Extension modules: torch._C, numpy.core._multiarray_umath (total: 2)
//
// Frames are printed most recent call first; at most 100 per thread (then
// "  ...") and at most 100 threads (then "..."); the file is "???" and the
// line "???" when unknown. Threads are separated by one blank line and the
// last thread has none after it, so dumps appended to one file run into each
// other: a thread header right after a frame line, a thread ID seen twice, or
// a second "Current thread" starts a new dump. Variants handled:
// "Stack (most recent call first):" (a single-thread dump, and the
// free-threaded build's fatal error, preceded by "<Cannot show all threads
// while the GIL is disabled>"); "Timeout (0:05:00)!" from dump_traceback_later;
// "Python runtime state: ..." and other text between a Py_FatalError header
// and the threads; "Windows fatal exception: ..."; "  <no Python frame>",
// "  <tstate is freed>" and "  Garbage-collecting" lines; thread names
// ("Thread 0x... [name] (most recent call first):", newer CPythons); the C stack
// ("Current thread's C stack trace (most recent call first):" followed by
// "  Binary file ..." lines, CPython 3.14+); and the "Extension modules:" line.
//
// Tracebacks, as the traceback module and the default sys.excepthook print
// them (note ", in" with a comma where faulthandler has " in"):
//
//	Traceback (most recent call last):
//	  File "/home/u/train.py", line 97, in <module>
//	    main()
//	  File "/home/u/train.py", line 30, in step
//	    loss = model(x)
//	           ^^^^^^^^
//	RuntimeError: loss is NaN
//
// with chained exceptions ("During handling of the above exception, another
// exception occurred:" / "The above exception was the direct cause of the
// following exception:"), "  [Previous line repeated N more times]",
// SyntaxError frames (no ", in func"), multi-line messages, exception groups
// ("  + Exception Group Traceback (most recent call last):", whose
// sub-exceptions are skipped), ANSI colours (3.13+), progress bars that
// redraw with \r (only the text after the last \r of a line counts, and a
// header may follow the bar on the same line), and a constant per-line prefix
// such as torchrun's "[default0]:" or "[rank3]: " (each prefix is tracked on
// its own, so interleaved output of several ranks is parsed per rank).
// Text that a traceback's message contains which is itself a traceback (a
// DataLoader worker's "Original Traceback (most recent call last):") is parsed
// as a traceback of its own.
//
// Dumps are found with or without a constant per-line prefix too, but dumps
// of several processes interleaved line by line in one stream are not
// separated: keep one dump file per rank (faulthandler.register(sig,
// file=...)).
//
// All parsing is a single pass over the input with fixed caps (threads per
// dump, frames per thread, message size, tracked prefixes), so arbitrary
// input costs time linear in its size and never panics.
//
// Classify, Collective, UserFrame and MainThread interpret the result: which
// thread runs the script, what it is blocked in (a torch.distributed
// collective, a threading lock, I/O, the user's own code, another library),
// and the innermost frame of the user's code.
package pytrace
