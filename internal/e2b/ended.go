package e2b

import (
	"context"
	"errors"
	"net/http"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// sandboxEnded reports whether sandbox id is gone or being destroyed
// (killed, timed out): what a stream to it that broke off means.
func (h *Handler) sandboxEnded(id string) bool {
	sb, err := h.svc.Get(context.Background(), sandbox.Caller{Admin: true}, id)
	if err != nil {
		return errors.Is(err, errdefs.ErrNotFound)
	}
	return sb.State == sandbox.StateStopping || sb.State == sandbox.StateStopped
}

// dropConnection ends a response by closing its connection in the middle
// of the body, as E2B's proxy does when the sandbox behind it goes away.
// The SDKs know that sign: the connection was terminated, envd's /health
// answers 502 (not running), and they raise their own TimeoutError ("the
// sandbox was killed or reached its end of life while the request was in
// flight"). An error sent in the stream instead became "[unavailable]
// agent unreachable" (a command) or an empty execution (runCode). net/http
// recovers http.ErrAbortHandler quietly; it does not return.
func dropConnection() {
	panic(http.ErrAbortHandler)
}
