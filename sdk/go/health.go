package space

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Health is the answer of GET /healthz.
type Health struct {
	Status string `json:"status"`           // "ok" or "starting"
	Detail string `json:"detail,omitempty"` // why the server is not ready
}

// Health asks whether the server can create sandboxes. A server that is up but
// not ready returns its Health and an *APIError with IsUnavailable(err).
func (c *Client) Health(ctx context.Context) (*Health, error) {
	u, err := c.endpoint("/healthz", nil)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var h Health
	if json.Unmarshal(b, &h) != nil || h.Status == "" {
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return nil, decodeError(resp)
	}
	if resp.StatusCode != http.StatusOK {
		msg := "server is " + h.Status
		if h.Detail != "" {
			msg += ": " + h.Detail
		}
		return &h, &APIError{Status: resp.StatusCode, Code: codeForStatus(resp.StatusCode), Message: msg}
	}
	return &h, nil
}

// OpenAPI returns the server's API description (GET /v1/openapi.yaml).
func (c *Client) OpenAPI(ctx context.Context) ([]byte, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/v1/openapi.yaml", header: http.Header{"Accept": {"application/yaml"}}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("space: read openapi.yaml: %w", err)
	}
	return b, nil
}
