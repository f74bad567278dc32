package procfs

// Sockets: which sockets a process holds (/proc/<pid>/fd links
// "socket:[inode]") and which of the network namespace's sockets listen
// (/proc/<pid>/net/{tcp,tcp6,udp,udp6,unix}), so a test can list every
// listener of a process tree and hold it against the threat model
// (integration/sockets_test.go, docs/security.md).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Socket is one line of /proc/net/{tcp,tcp6,udp,udp6,unix}.
type Socket struct {
	Inode uint64
	// Network is "tcp", "udp" (IPv4 and IPv6 alike: the address tells)
	// or "unix".
	Network string
	// Local is the bound address of a TCP or UDP socket; an IPv4 address
	// held by an IPv6 socket (::ffff:a.b.c.d) is given as IPv4.
	Local netip.AddrPort
	// Path is a Unix socket's bound path ("@name" in the abstract
	// namespace; "" unbound).
	Path string
	// State is the kernel's socket state: TCP's (0x0A LISTEN, 0x01
	// ESTABLISHED, 0x07 CLOSE, ...) for TCP and UDP, the socket state
	// (1 unconnected, 3 connected) for Unix sockets.
	State int
	// Listening: a TCP socket in LISTEN; a bound, unconnected UDP socket
	// (it receives from anyone); a Unix stream or seqpacket socket that
	// accepts connections (__SO_ACCEPTCON), or a Unix datagram socket
	// bound to a path and not connected.
	Listening bool
}

// String names the socket as "network address", the address a path for
// Unix sockets.
func (s Socket) String() string {
	if s.Network == "unix" {
		return "unix " + s.Path
	}
	return s.Network + " " + s.Local.String()
}

// tcpListen is TCP_LISTEN, tcpClose TCP_CLOSE (an unconnected UDP socket).
const (
	tcpListen = 0x0A
	tcpClose  = 0x07
)

// Unix socket flags and types of /proc/net/unix.
const (
	unixAcceptCon = 1 << 16 // __SO_ACCEPTCON: listen(2) was called
	unixStream    = 1
	unixDgram     = 2
	unixSeqpacket = 5
	unixConnected = 3 // SS_CONNECTED
)

// ParseNetInet parses /proc/net/tcp, tcp6, udp or udp6 (network "tcp" or
// "udp"): a header line, then one socket a line,
// "sl local_address rem_address st ... uid timeout inode ...".
func ParseNetInet(network string, r io.Reader) ([]Socket, error) {
	if network != "tcp" && network != "udp" {
		return nil, fmt.Errorf("procfs: network %q: want tcp or udp", network)
	}
	var out []Socket
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if n == 1 && len(f) > 0 && f[0] == "sl" {
			continue
		}
		if len(f) == 0 {
			continue
		}
		if len(f) < 10 {
			return nil, fmt.Errorf("procfs: /proc/net/%s line %d: %d fields, want at least 10: %q", network, n, len(f), sc.Text())
		}
		local, err := parseInetAddr(f[1])
		if err != nil {
			return nil, fmt.Errorf("procfs: /proc/net/%s line %d: local address: %w", network, n, err)
		}
		remote, err := parseInetAddr(f[2])
		if err != nil {
			return nil, fmt.Errorf("procfs: /proc/net/%s line %d: remote address: %w", network, n, err)
		}
		st, err := strconv.ParseUint(f[3], 16, 8)
		if err != nil {
			return nil, fmt.Errorf("procfs: /proc/net/%s line %d: state %q: %w", network, n, f[3], err)
		}
		inode, err := strconv.ParseUint(f[9], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("procfs: /proc/net/%s line %d: inode %q: %w", network, n, f[9], err)
		}
		s := Socket{Inode: inode, Network: network, Local: local, State: int(st)}
		switch network {
		case "tcp":
			s.Listening = st == tcpListen
		case "udp":
			s.Listening = st == tcpClose && local.Port() != 0 && remote.Port() == 0
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("procfs: /proc/net/%s: %w", network, err)
	}
	return out, nil
}

// parseInetAddr parses "ADDR:PORT" of /proc/net/tcp: ADDR is 8 (IPv4) or
// 32 (IPv6) hex digits, each 32-bit word printed as the kernel holds it
// in memory (native byte order), PORT 4 hex digits.
func parseInetAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q: no port", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: port: %w", s, err)
	}
	if len(a) != 8 && len(a) != 32 {
		return netip.AddrPort{}, fmt.Errorf("%q: address of %d hex digits, want 8 or 32", s, len(a))
	}
	raw := make([]byte, len(a)/2)
	for i := 0; i < len(a); i += 8 {
		w, err := strconv.ParseUint(a[i:i+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("%q: address: %w", s, err)
		}
		binary.NativeEndian.PutUint32(raw[i/2:], uint32(w))
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}

// ParseNetUnix parses /proc/net/unix: a header line, then
// "Num RefCount Protocol Flags Type St Inode [Path]" a line (hex but the
// inode; the path may hold spaces).
func ParseNetUnix(r io.Reader) ([]Socket, error) {
	var out []Socket
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		f := strings.Fields(line)
		if n == 1 && len(f) > 0 && f[0] == "Num" {
			continue
		}
		if len(f) == 0 {
			continue
		}
		if len(f) < 7 {
			return nil, fmt.Errorf("procfs: /proc/net/unix line %d: %d fields, want at least 7: %q", n, len(f), line)
		}
		flags, err1 := strconv.ParseUint(f[3], 16, 32)
		typ, err2 := strconv.ParseUint(f[4], 16, 16)
		st, err3 := strconv.ParseUint(f[5], 16, 8)
		inode, err4 := strconv.ParseUint(f[6], 10, 64)
		for _, err := range []error{err1, err2, err3, err4} {
			if err != nil {
				return nil, fmt.Errorf("procfs: /proc/net/unix line %d: %w: %q", n, err, line)
			}
		}
		path := ""
		if len(f) > 7 {
			// After the seventh field and the one space before the path.
			rest := line
			for i := 0; i < 7; i++ {
				rest = strings.TrimLeft(rest, " ")
				rest = rest[strings.IndexByte(rest, ' ')+1:]
			}
			path = rest
		}
		s := Socket{Inode: inode, Network: "unix", Path: path, State: int(st)}
		switch typ {
		case unixStream, unixSeqpacket:
			s.Listening = flags&unixAcceptCon != 0
		case unixDgram:
			s.Listening = path != "" && st != unixConnected
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("procfs: /proc/net/unix: %w", err)
	}
	return out, nil
}

// NetSockets returns every socket of the network namespace that process
// pid is in (its /proc/<pid>/net files), by inode.
func NetSockets(pid int) (map[uint64]Socket, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "net")
	out := map[uint64]Socket{}
	for _, f := range []struct{ file, network string }{
		{"tcp", "tcp"}, {"tcp6", "tcp"}, {"udp", "udp"}, {"udp6", "udp"}, {"unix", "unix"},
	} {
		b, err := os.ReadFile(filepath.Join(dir, f.file))
		if err != nil {
			if os.IsNotExist(err) && (f.file == "tcp6" || f.file == "udp6") {
				continue // IPv6 disabled
			}
			return nil, fmt.Errorf("procfs: %w", err)
		}
		var socks []Socket
		if f.network == "unix" {
			socks, err = ParseNetUnix(bytes.NewReader(b))
		} else {
			socks, err = ParseNetInet(f.network, bytes.NewReader(b))
		}
		if err != nil {
			return nil, err
		}
		for _, s := range socks {
			out[s.Inode] = s
		}
	}
	return out, nil
}

// SocketInodes returns the inodes of the sockets process pid holds open
// (its fds that link to "socket:[inode]"), each once. Fds closed while
// being read are skipped.
func SocketInodes(pid int) ([]uint64, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("procfs: fds of %d: %w", pid, err)
	}
	seen := map[uint64]bool{}
	var out []uint64
	for _, e := range entries {
		link, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		inode, ok := SocketInode(link)
		if ok && !seen[inode] {
			seen[inode] = true
			out = append(out, inode)
		}
	}
	return out, nil
}

// SocketInode parses an fd link "socket:[12345]".
func SocketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// Descendants returns pid's descendants (children first, then theirs),
// from /proc/<pid>/task/<tid>/children of every thread: a child is listed
// under the thread that started it. Processes that exit meanwhile are
// skipped.
func Descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	seen := map[int]bool{pid: true}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tids, err := Threads(p)
		if err != nil {
			continue
		}
		for _, tid := range tids {
			b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p), "task", strconv.Itoa(tid), "children"))
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				c, err := strconv.Atoi(f)
				if err == nil && !seen[c] {
					seen[c] = true
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
	}
	return out
}
