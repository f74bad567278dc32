// Package nvrxwire speaks the wire protocol of NVIDIA nvrx's rank monitor
// (nvidia_resiliency_ext.fault_tolerance): frames of a 4-byte big-endian
// length followed by a pickle, exchanged over Unix stream sockets between a
// training rank (RankMonitorClient) and its monitor, and between a rank and
// the launcher (workload-control requests).
//
// Decoding uses a restricted unpickler written in Go. It understands the
// opcodes CPython 3.8-3.14 emits for nvrx's messages under protocols 2-5
// and builds values only from a fixed whitelist of globals: the message
// classes and enums of nvidia_resiliency_ext.fault_tolerance.data,
// config.FaultToleranceConfig, signal.Signals (and its SIG* members), and the
// few builtins protocol 2 needs to spell bytes, sets and bytearrays. No
// global is ever called: each maps to a fixed Go constructor of plain data.
// Containers are sealed once referenced, so decoded values are always
// acyclic, and depth, item counts, memo, stack and shared-reference expansion
// are all bounded (see the Max* constants). Any violation is an error that
// names the offending global or opcode offset; no input panics.
//
// Encoding produces protocol 4 pickles (GLOBAL + NEWOBJ + BUILD, no FRAME,
// no memo) of OkMsg, ErrorMsg and b'ok', which every CPython from 3.4 loads.
//
// Golden vectors in testdata/golden are raw (unframed) pickles produced by
// CPython from stand-in classes with nvrx's exact module and class names; see
// testdata/gen_golden.py to regenerate them with /usr/bin/python3.
package nvrxwire
