package space

import (
	"context"
	"net/http"
	"time"
)

// Key is an API key. Key.Key is set only in CreateKey's answer: the server
// never shows it again.
type Key struct {
	ID        string    `json:"id"`
	Key       string    `json:"key,omitempty"`
	Team      string    `json:"team"`
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// CreateKeyRequest is the body of POST /v1/keys.
type CreateKeyRequest struct {
	Team string `json:"team"`
	Name string `json:"name,omitempty"`
}

// CreateKey (admin) mints an API key for a team. The returned Key.Key is the
// secret, shown this once.
func (c *Client) CreateKey(ctx context.Context, req CreateKeyRequest) (*Key, error) {
	var k Key
	if err := c.do(ctx, request{method: http.MethodPost, path: "/v1/keys", json: req}, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ListKeys (admin) lists API keys, without their secrets.
func (c *Client) ListKeys(ctx context.Context) ([]Key, error) {
	var out struct {
		Keys []Key `json:"keys"`
	}
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/keys"}, &out); err != nil {
		return nil, err
	}
	return out.Keys, nil
}

// DeleteKey (admin) revokes an API key.
func (c *Client) DeleteKey(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/keys/" + seg(id)}, nil)
}
