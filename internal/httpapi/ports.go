package httpapi

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// portProxy forwards any request under /v1/sandboxes/{id}/ports/{port}/ to
// that port on the sandbox's loopback (HTTP and WebSocket upgrades), with
// the rest of the path. The API key is checked here and not passed on.
func (a *API) portProxy(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	id := r.PathValue("id")
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		a.writeError(w, r, errdefs.InvalidArgument("port: a number from 1 to 65535"))
		return
	}
	// Checked on every request: a kept-alive connection to the port is
	// reused without a new dial.
	sb, err := a.svc.Get(r.Context(), c, id)
	switch {
	case err == nil && sandbox.Wakeable(sb):
		err = a.svc.Wake(r.Context(), c, id) // before a kept-alive connection is reused
	case err == nil && sb.State != sandbox.StateRunning:
		err = errdefs.Newf(errdefs.ErrConflict, "sandbox %s is %s", id, sb.State)
	}
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	// The app's own Authorization passes when the key came as X-API-Key.
	var strip []string
	if _, inAuth := APIKey(r); inAuth {
		strip = []string{"Authorization"}
	}
	// The rest of the path as the client escaped it (PathValue is
	// decoded): /v1/sandboxes/{id}/ports/{port}/{path...}.
	rest := "/"
	if parts := strings.SplitN(r.URL.EscapedPath(), "/", 7); len(parts) == 7 {
		rest += parts[6]
	}
	a.ports.Serve(w, r.WithContext(sandbox.WithCaller(r.Context(), c)), id, port, rest, strip, a.writeError)
}
