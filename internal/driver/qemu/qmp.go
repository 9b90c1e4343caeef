package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// qmp is one connection to QEMU's QMP monitor (a unix socket QEMU serves
// with server=on,wait=off). QEMU serves one QMP client at a time, so the
// driver connects per operation and closes afterwards: nothing is held
// across a server restart.
type qmp struct {
	c   net.Conn
	rd  *bufio.Reader
	oob []byte // ancillary data (a descriptor) for the next command (sendFD)
}

// qmpError is an error answer from QEMU.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return fmt.Sprintf("qmp: %s: %s", e.Class, e.Desc) }

// dialQMP connects to the QMP socket at path, reads the greeting and
// negotiates capabilities. ctx bounds the whole exchange.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	q := &qmp{c: c, rd: bufio.NewReader(c)}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.read(&greeting); err != nil || greeting.QMP == nil {
		c.Close()
		return nil, fmt.Errorf("qmp greeting: %v", err)
	}
	if err := q.execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) Close() error { return q.c.Close() }

func (q *qmp) read(v any) error {
	line, err := q.rd.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

// execute runs one command and decodes its "return" into out (if not nil).
// Asynchronous events arriving meanwhile are skipped.
func (q *qmp) execute(ctx context.Context, cmd string, args, out any) error {
	stop := context.AfterFunc(ctx, func() { q.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	var err error
	if uc, ok := q.c.(*net.UnixConn); ok && q.oob != nil {
		_, _, err = uc.WriteMsgUnix(append(b, '\n'), q.oob, nil)
	} else {
		_, err = q.c.Write(append(b, '\n'))
	}
	if err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := q.read(&resp); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
			}
			return fmt.Errorf("qmp %s: %w", cmd, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return resp.Error
		case resp.Return != nil:
			if out != nil {
				return json.Unmarshal(resp.Return, out)
			}
			return nil
		default:
			return errors.New("qmp " + cmd + ": unexpected message")
		}
	}
}

// sendFD hands QEMU a copy of f under name (getfd: the descriptor rides
// on the command as SCM_RIGHTS), for a later command to use ("fd:name").
func (q *qmp) sendFD(ctx context.Context, name string, f *os.File) error {
	if _, ok := q.c.(*net.UnixConn); !ok {
		return errors.New("qmp getfd: not a unix socket")
	}
	q.oob = unix.UnixRights(int(f.Fd()))
	defer func() { q.oob = nil }()
	err := q.execute(ctx, "getfd", map[string]any{"fdname": name}, nil)
	runtime.KeepAlive(f) // the descriptor stays open until it was sent
	return err
}

// qmpDo connects, runs one command and disconnects.
func qmpDo(ctx context.Context, path, cmd string, args, out any) error {
	q, err := dialQMP(ctx, path)
	if err != nil {
		return err
	}
	defer q.Close()
	return q.execute(ctx, cmd, args, out)
}

// status is QEMU's run state ("running", "paused", "inmigrate",
// "postmigrate", ...).
func (q *qmp) status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	err := q.execute(ctx, "query-status", nil, &st)
	return st.Status, err
}
