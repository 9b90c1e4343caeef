package agentclient

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Connect opens a TCP connection to port on the sandbox's loopback,
// carried by one stream of the agent session (agent protocol 5). Errors:
// ErrUnavailable when nothing listens there, ErrPermissionDenied for the
// agent's own port, ErrNotSupported for an older agent.
func (c *Client) Connect(ctx context.Context, port int) (net.Conn, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	st, err := s.ys.OpenStream()
	if err != nil {
		return nil, transportError(ctx, err)
	}
	ok := false
	defer func() {
		if !ok {
			st.Close()
		}
	}()
	if d, has := ctx.Deadline(); has {
		st.SetDeadline(d)
	} else {
		st.SetDeadline(time.Now().Add(UnaryTimeout))
	}
	req, _ := http.NewRequest(http.MethodPost, "http://agent"+agentproto.PathConnect+"?port="+strconv.Itoa(port), nil)
	if err := req.Write(st); err != nil {
		return nil, transportError(ctx, err)
	}
	// The header block is read through a budget (http.ReadResponse has
	// none), lifted once it is read.
	lr := &io.LimitedReader{R: st, N: MaxHeaderBytes}
	br := bufio.NewReaderSize(lr, 32<<10)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		if lr.N <= 0 {
			return nil, tooLarge("the answer to POST "+agentproto.PathConnect, MaxHeaderBytes, "header bytes")
		}
		return nil, transportError(ctx, fmt.Errorf("connect to port %d: %w", port, err))
	}
	lr.N = math.MaxInt64
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound { // the agent has no such route
			return nil, errdefs.NotSupported("this sandbox's agent cannot connect to its ports (it predates agent protocol 5)")
		}
		return nil, decodeError(resp)
	}
	st.SetDeadline(time.Time{})
	ok = true
	return &bufferedConn{Conn: st, r: br}, nil
}
