package security

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	space "github.com/spacesandbox/space/sdk/go"
)

// ClientTarget is a Target over a server's public API: the SDK for
// everything it has, plain HTTP for creating a sandbox with a network
// policy.
type ClientTarget struct {
	c        *space.Client
	url, key string
}

var _ Target = (*ClientTarget)(nil)

// NewClientTarget talks to the server at url with an API key.
func NewClientTarget(url, key string) *ClientTarget {
	return &ClientTarget{c: space.NewClient(url, key, space.WithUserAgent("space-security-probe")), url: strings.TrimRight(url, "/"), key: key}
}

func (t *ClientTarget) PutSecret(ctx context.Context, req space.PutSecretRequest) error {
	return t.c.PutSecret(ctx, req)
}

func (t *ClientTarget) DeleteSecret(ctx context.Context, name string) error {
	return t.c.DeleteSecret(ctx, name)
}

func (t *ClientTarget) CreateSandbox(ctx context.Context, allow, secrets []string) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"network":   map[string]any{"allow": allow},
		"secrets":   secrets,
		"timeout_s": 900,
		"disk_mb":   ProbeDiskMB, // the disk-fill probe writes past it
		"metadata":  map[string]string{"purpose": "security-probe"},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url+"/v1/sandboxes", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+t.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
		return "", fmt.Errorf("create sandbox: %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	var sb space.Sandbox
	if err := json.Unmarshal(data, &sb); err != nil {
		return "", err
	}
	return sb.ID, nil
}

func (t *ClientTarget) Exec(ctx context.Context, id string, req space.ExecRequest) (*space.ExecResult, error) {
	return t.c.Exec(ctx, id, req)
}

func (t *ClientTarget) EgressLog(ctx context.Context, id string) ([]space.EgressRecord, error) {
	return t.c.EgressLog(ctx, id, 10000)
}

func (t *ClientTarget) Destroy(ctx context.Context, id string) error {
	return t.c.KillSandbox(ctx, id)
}
