package space

import (
	"context"
	"net/http"
	"time"
)

// NetworkPolicy is a sandbox's egress policy: the destinations it may reach
// and those it may not (deny wins). Entries are host names
// ("api.github.com"), wildcards with an optional port
// ("*.pythonhosted.org:443"), "*" for the public internet, or CIDRs. An
// empty policy means no network at all.
type NetworkPolicy struct {
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
}

// Network is a sandbox's current policy and the names of the secrets it may
// use.
type Network struct {
	Allow   []string `json:"allow"`
	Deny    []string `json:"deny"`
	Secrets []string `json:"secrets"`
}

// GetNetwork returns a sandbox's network policy; IsNotFound(err) when the
// sandbox does not exist.
func (c *Client) GetNetwork(ctx context.Context, id string) (*Network, error) {
	var n Network
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes/" + seg(id) + "/network"}, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// SetNetwork replaces a sandbox's network policy. The new policy applies to
// connections opened afterwards; open ones are not cut.
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (*Network, error) {
	if p.Allow == nil {
		p.Allow = []string{}
	}
	if p.Deny == nil {
		p.Deny = []string{}
	}
	var n Network
	if err := c.do(ctx, request{method: http.MethodPut, path: "/v1/sandboxes/" + seg(id) + "/network", json: p}, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Secret is a stored secret as the server lists it; its value is never
// returned.
type Secret struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`
	CreatedAt time.Time `json:"created_at"`
}

// ListSecrets returns the caller's team's secrets (names and hosts only).
func (c *Client) ListSecrets(ctx context.Context) ([]Secret, error) {
	var out struct {
		Secrets []Secret `json:"secrets"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/secrets"}, &out); err != nil {
		return nil, err
	}
	return out.Secrets, nil
}

// DeleteSecret removes a secret; IsNotFound(err) when there is none by that
// name. Sandboxes bound to it lose it for new connections.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/secrets/" + seg(name)}, nil)
}
