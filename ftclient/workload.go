package ftclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// RequestWorkloadAction sends a workload-control request ("Continue",
// "ExcludeThisNode", "ShutdownWorkload") to the launcher socket named by
// FT_LAUNCHER_IPC_SOCKET (or path when not empty) and waits for the
// acknowledgement.
func RequestWorkloadAction(ctx context.Context, path string, globalRank int, action, description string) error {
	if path == "" {
		path = os.Getenv("FT_LAUNCHER_IPC_SOCKET")
	}
	if path == "" {
		return errors.New("ftclient: FT_LAUNCHER_IPC_SOCKET is not set")
	}
	fd, err := dial(ctx, path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	c := &Client{fd: fd}
	p, err := json.Marshal(ftwire.WorkloadRequest{GlobalRank: globalRank, Action: action, Description: description})
	if err != nil {
		return fmt.Errorf("ftclient: encode request: %w", err)
	}
	if err := c.write(ftwire.AppendFrame([]byte(ftwire.Magic), ftwire.MsgWorkloadRequest, p)); err != nil {
		return fmt.Errorf("ftclient: send request: %w", err)
	}
	r := &fdReader{fd: fd}
	if err := ftwire.ReadMagic(r); err != nil {
		return fmt.Errorf("ftclient: read ack: %w", err)
	}
	t, err := r.ReadByte()
	if err != nil || t != ftwire.MsgAck {
		return fmt.Errorf("ftclient: unexpected ack type %#x: %v", t, err)
	}
	b, err := ftwire.ReadPayload(r)
	if err != nil {
		return fmt.Errorf("ftclient: read ack: %w", err)
	}
	var ack ftwire.Ack
	if err := json.Unmarshal(b, &ack); err != nil {
		return fmt.Errorf("ftclient: decode ack: %w", err)
	}
	if !ack.OK {
		return fmt.Errorf("ftclient: request refused: %s", ack.Error)
	}
	return nil
}
