package httpapi

import (
	"context"
	"net/http"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/security"
)

// SecurityRunner runs the shipped attack suite against this server
// (security.Local).
type SecurityRunner interface {
	// Probe runs the suite and returns its report (errdefs.ErrConflict
	// while another run is in progress).
	Probe(ctx context.Context, req security.Request) (*security.Report, error)
	// Last returns the last report (errdefs.ErrNotFound before any run).
	Last(ctx context.Context) (*security.Report, error)
}

var _ SecurityRunner = (*security.Local)(nil)

func (a *API) securityRunner(c sandbox.Caller) (SecurityRunner, error) {
	if !c.Admin {
		return nil, errdefs.Newf(errdefs.ErrPermissionDenied, "the security probe needs an admin key")
	}
	if a.cfg.Security == nil {
		return nil, errdefs.NotSupported("the security probe is not enabled on this server")
	}
	return a.cfg.Security, nil
}

// securityProbe runs the suite synchronously (a minute or two) and answers
// with the report.
func (a *API) securityProbe(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	run, err := a.securityRunner(c)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	var req security.Request
	if r.ContentLength != 0 {
		if err := decode(r, &req); err != nil {
			a.writeError(w, r, err)
			return
		}
	}
	rep, err := run.Probe(r.Context(), req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (a *API) securityReport(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	run, err := a.securityRunner(c)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	rep, err := run.Last(r.Context())
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}
