package e2b

import (
	"errors"
	"net/http"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

// servePort forwards a request for any other port of a sandbox (what
// sandbox.getHost(port) names) to that port on the sandbox's loopback,
// HTTP and WebSocket upgrades alike. Real E2B serves these URLs to anyone
// unless the sandbox was created with allowPublicTraffic: false; space
// asks every request for the sandbox's traffic access token
// (E2B-Traffic-Access-Token) or envd access token (X-Access-Token), which
// are not passed on, unless the sandbox was created with
// allowPublicTraffic: true (store.Sandbox.PublicPorts).
//
// Without a token a missing id, a stopped sandbox and a private one get the
// same 401: only a sandbox whose owner made its ports public answers
// anyone, and unauthenticated callers learn nothing about other ids.
func (h *Handler) servePort(w http.ResponseWriter, r *http.Request, id string, port int) {
	sb, err := h.svc.Get(r.Context(), sandbox.Caller{Admin: true}, id)
	public := err == nil && sb.PublicPorts && sb.State != sandbox.StateStopped && sb.State != sandbox.StateStopping
	if !public && !h.trafficAllowed(r, id) {
		writeJSONError(w, http.StatusUnauthorized, "unauthorized: sandbox ports need the E2B-Traffic-Access-Token header (the create answer's trafficAccessToken) or X-Access-Token")
		return
	}
	if err != nil || (sb.State != sandbox.StateRunning && !sandbox.Wakeable(sb)) {
		writeJSONError(w, http.StatusBadGateway, "sandbox "+e2bID(id)+" is not running")
		return
	}
	if sandbox.Wakeable(sb) { // autoResume: traffic wakes it
		if err := h.svc.Wake(r.Context(), sandbox.Caller{Team: sb.Team}, id); err != nil {
			writeJSONError(w, http.StatusBadGateway, "sandbox "+e2bID(id)+" could not be resumed: "+err.Error())
			return
		}
	}
	ctx := sandbox.WithCaller(r.Context(), sandbox.Caller{Team: sb.Team})
	// E2B's credentials travel in headers of their own (removed by the
	// proxy); Authorization is the app's.
	h.ports.Serve(w, r.WithContext(ctx), id, port, r.URL.EscapedPath(), nil, func(w http.ResponseWriter, r *http.Request, err error) {
		_, status := errdefs.Classify(err)
		if errors.Is(err, errdefs.ErrUnavailable) {
			status = http.StatusBadGateway // as E2B's proxy answers for a closed port
		}
		writeJSONError(w, status, err.Error())
	})
}
