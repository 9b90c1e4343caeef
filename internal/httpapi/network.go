package httpapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/spacesandbox/space/internal/egress"
	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/sandbox"
)

type networkView struct {
	Allow   []string `json:"allow"`
	Deny    []string `json:"deny"`
	Secrets []string `json:"secrets"`
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func (a *API) getNetwork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	spec, secrets, err := a.svc.Network(r.Context(), c, r.PathValue("id"))
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, networkView{Allow: nonNil(spec.Allow), Deny: nonNil(spec.Deny), Secrets: nonNil(secrets)})
}

func (a *API) setNetwork(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var spec sandbox.NetworkSpec
	if err := decode(r, &spec); err != nil {
		a.writeError(w, r, err)
		return
	}
	if _, err := a.svc.SetNetwork(r.Context(), c, r.PathValue("id"), spec); err != nil {
		a.writeError(w, r, err)
		return
	}
	a.getNetwork(w, r, c)
}

func (a *API) egressLog(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	limit := 0
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			a.writeError(w, r, errdefs.InvalidArgument("limit: a number of records, 0 or more"))
			return
		}
		limit = n
	}
	recs, err := a.svc.EgressLog(r.Context(), c, r.PathValue("id"), limit)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	if recs == nil {
		recs = []egress.Record{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": recs})
}

type secretView struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	CreatedAt time.Time `json:"created_at"`
}

func (a *API) putSecret(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	var req sandbox.SecretRequest
	if err := decode(r, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	m, err := a.svc.PutSecret(r.Context(), c, req)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, secretView{Name: m.Name, Hosts: nonNil(m.Hosts), CreatedAt: m.CreatedAt})
}

func (a *API) listSecrets(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	ms, err := a.svc.Secrets(r.Context(), c)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	out := []secretView{}
	for _, m := range ms {
		out = append(out, secretView{Name: m.Name, Hosts: nonNil(m.Hosts), CreatedAt: m.CreatedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"secrets": out})
}

func (a *API) deleteSecret(w http.ResponseWriter, r *http.Request, c sandbox.Caller) {
	if err := a.svc.DeleteSecret(r.Context(), c, r.PathValue("name")); err != nil {
		a.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
