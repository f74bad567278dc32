package procfs

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// native rewrites the address words of a sample line taken on a
// little-endian machine as this machine's kernel prints them (each 32-bit
// word in native byte order), so the samples hold on big-endian machines.
func native(line string) string {
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 {
		return line
	}
	return regexp.MustCompile(`\b[0-9A-F]{8,32}:`).ReplaceAllStringFunc(line, func(m string) string {
		var b strings.Builder
		for i := 0; i+8 <= len(m)-1; i += 8 {
			w := m[i : i+8]
			b.WriteString(w[6:8] + w[4:6] + w[2:4] + w[0:2])
		}
		return b.String() + ":"
	})
}

const inetHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

func TestParseNetInet(t *testing.T) {
	ap := netip.MustParseAddrPort
	tests := []struct {
		name    string
		network string
		line    string
		want    Socket
	}{
		{"tcp listen on loopback", "tcp",
			"   1: 0100007F:A09D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 828759 2 000000001d2f5ac7 100 0 0 10 0",
			Socket{Inode: 828759, Network: "tcp", Local: ap("127.0.0.1:41117"), State: 0x0A, Listening: true}},
		{"tcp listen on every interface", "tcp",
			"   0: 00000000:07E8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1063 1 000000007d356089 100 0 0 10 0",
			Socket{Inode: 1063, Network: "tcp", Local: ap("0.0.0.0:2024"), State: 0x0A, Listening: true}},
		{"tcp established is not a listener", "tcp",
			"   2: 0200007F:9C40 0300007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 20 4 30 10 -1",
			Socket{Inode: 4242, Network: "tcp", Local: ap("127.0.0.2:40000"), State: 0x01}},
		{"tcp6 v4-mapped in time-wait", "tcp",
			"   0: 0000000000000000FFFF00000100007F:CED6 0000000000000000FFFF00000100007F:957B 06 00000000:00000000 03:00000C4E 00000000     0        0 0 3 00000000fc39f985",
			Socket{Inode: 0, Network: "tcp", Local: ap("127.0.0.1:52950"), State: 0x06}},
		{"tcp6 listen on every interface", "tcp",
			"   1: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5555 1 0000000000000000 100 0 0 10 0",
			Socket{Inode: 5555, Network: "tcp", Local: ap("[::]:8080"), State: 0x0A, Listening: true}},
		{"tcp6 listen on ::1", "tcp",
			"   2: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 6666 1 0000000000000000 100 0 0 10 0",
			Socket{Inode: 6666, Network: "tcp", Local: ap("[::1]:22"), State: 0x0A, Listening: true}},
		{"udp bound and unconnected receives", "udp",
			"  7: 0200007F:A1B2 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 7777 2 0000000000000000 0",
			Socket{Inode: 7777, Network: "udp", Local: ap("127.0.0.2:41394"), State: 0x07, Listening: true}},
		{"udp connected", "udp",
			"  8: 0200007F:A1B3 0300007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 8888 2 0000000000000000 0",
			Socket{Inode: 8888, Network: "udp", Local: ap("127.0.0.2:41395"), State: 0x01}},
		{"udp6 every interface", "udp",
			"  9: 00000000000000000000000000000000:14E9 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 9999 2 0000000000000000 0",
			Socket{Inode: 9999, Network: "udp", Local: ap("[::]:5353"), State: 0x07, Listening: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNetInet(tc.network, strings.NewReader(inetHeader+native(tc.line)+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestParseNetInetErrors(t *testing.T) {
	tests := []struct{ name, network, line, want string }{
		{"network", "sctp", "", "want tcp or udp"},
		{"short line", "tcp", "   0: 0100007F:A09D 00000000:0000 0A", "fields, want at least 10"},
		{"odd address", "tcp", "   0: 0100007:A09D 00000000:0000 0A 0:0 0:0 0 0 0 1", "want 8 or 32"},
		{"no port", "tcp", "   0: 0100007F 00000000:0000 0A 0:0 0:0 0 0 0 1", "no port"},
		{"bad inode", "udp", "   0: 0100007F:A09D 00000000:0000 07 0:0 0:0 0 0 0 x1", "inode"},
		{"bad state", "tcp", "   0: 0100007F:A09D 00000000:0000 ZZ 0:0 0:0 0 0 0 1", "state"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseNetInet(tc.network, strings.NewReader(inetHeader+tc.line+"\n"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

func TestParseNetUnix(t *testing.T) {
	const header = "Num       RefCount Protocol Flags    Type St Inode Path\n"
	tests := []struct {
		name string
		line string
		want Socket
	}{
		{"stream listener", "000000001e4c3817: 00000002 00000000 00010000 0001 01 829300 /tmp/ftl-rmon-1/rmon0.sock",
			Socket{Inode: 829300, Network: "unix", Path: "/tmp/ftl-rmon-1/rmon0.sock", State: 1, Listening: true}},
		{"accepted stream of a listener's path", "000000001e4c3818: 00000003 00000000 00000000 0001 03 829301 /tmp/ftl-rmon-1/rmon0.sock",
			Socket{Inode: 829301, Network: "unix", Path: "/tmp/ftl-rmon-1/rmon0.sock", State: 3}},
		{"unnamed socketpair end", "00000000128334a9: 00000003 00000000 00000000 0001 03  1059",
			Socket{Inode: 1059, Network: "unix", State: 3}},
		{"bound datagram socket receives", "000000001e4c3819: 00000002 00000000 00000000 0002 01 829258 @76faf",
			Socket{Inode: 829258, Network: "unix", Path: "@76faf", State: 1, Listening: true}},
		{"unbound datagram socket", "000000001e4c381a: 00000002 00000000 00000000 0002 01 829259",
			Socket{Inode: 829259, Network: "unix", State: 1}},
		{"seqpacket listener, path with a space", "000000001e4c381b: 00000002 00000000 00010000 0005 01 829260 /tmp/a b.sock",
			Socket{Inode: 829260, Network: "unix", Path: "/tmp/a b.sock", State: 1, Listening: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNetUnix(strings.NewReader(header + tc.line + "\n"))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, bad := range []string{"000000001e4c3817: 00000002 00000000 00010000 0001 01", "x: 2 0 zz 0001 01 1 /p", "x: 2 0 0 0001 01 -1 /p"} {
		if _, err := ParseNetUnix(strings.NewReader(header + bad + "\n")); err == nil {
			t.Errorf("ParseNetUnix(%q): no error", bad)
		}
	}
}

func TestSocketInode(t *testing.T) {
	tests := []struct {
		link string
		want uint64
		ok   bool
	}{
		{"socket:[829300]", 829300, true},
		{"socket:[]", 0, false},
		{"pipe:[829300]", 0, false},
		{"socket:[12", 0, false},
		{"/dev/null", 0, false},
	}
	for _, tc := range tests {
		got, ok := SocketInode(tc.link)
		if got != tc.want || ok != tc.ok {
			t.Errorf("SocketInode(%q) = %d, %v; want %d, %v", tc.link, got, ok, tc.want, tc.ok)
		}
	}
}

// TestOwnListeners: this process's own TCP, UDP and Unix listeners are
// found among its sockets, listening, at their addresses; a connected
// TCP socket is found and not listening.
func TestOwnListeners(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	ul, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	path := filepath.Join(t.TempDir(), "l.sock")
	xl, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer xl.Close()
	c, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	all, err := NetSockets(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	inodes, err := SocketInodes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var listening, other []string
	for _, in := range inodes {
		s, ok := all[in]
		if !ok {
			continue
		}
		if s.Listening {
			listening = append(listening, s.String())
		} else {
			other = append(other, s.String())
		}
	}
	for _, want := range []string{"tcp " + tl.Addr().String(), "udp " + ul.LocalAddr().String(), "unix " + path} {
		if !slices.Contains(listening, want) {
			t.Errorf("%s not among this process's listeners %v", want, listening)
		}
	}
	if want := "tcp " + c.LocalAddr().String(); !slices.Contains(other, want) || slices.Contains(listening, want) {
		t.Errorf("the connected socket %s: listeners %v, others %v", want, listening, other)
	}
}

// TestDescendants: a grandchild is found through its parent.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("/bin/sh", "-c", "sleep 60 & echo $!; wait")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var grandchild int
	defer func() {
		if grandchild > 0 {
			_ = killPID(grandchild)
		}
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	buf := make([]byte, 32)
	n, _ := out.Read(buf)
	grandchild, err = strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil {
		t.Fatalf("grandchild pid %q: %v", buf[:n], err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		d := Descendants(os.Getpid())
		if slices.Contains(d, cmd.Process.Pid) && slices.Contains(d, grandchild) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("descendants %v lack the child %d or the grandchild %d", d, cmd.Process.Pid, grandchild)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killPID kills pid.
func killPID(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}
