package space

import (
	"context"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Command is one process started in a sandbox through the API, as the
// server recorded it. The history is kept as long as the sandbox's
// record, after the sandbox stopped too.
type Command struct {
	ID         int64      `json:"id"` // what RestoreBefore and snapshots' CommandID name
	PID        int        `json:"pid"`
	Cmd        []string   `json:"cmd"` // a shell command is ["/bin/bash", "-lc", command]
	Tag        string     `json:"tag,omitempty"`
	Background bool       `json:"background"`
	StartedAt  time.Time  `json:"started_at"`
	ExitCode   *int       `json:"exit_code,omitempty"` // -1: ended by a signal; nil until it ended
	ExitedAt   *time.Time `json:"exited_at,omitempty"`
	// State: "exited", "running", or "unknown" (its end was never seen:
	// it ran in the background and the sandbox stopped first).
	State string `json:"state"`
}

// CommandList is one page of a sandbox's commands.
type CommandList struct {
	Commands   []Command `json:"commands"`
	NextCursor string    `json:"next_cursor,omitempty"` // empty on the last page
}

// Commands returns one page of the commands started in a sandbox, oldest
// first: limit per page (0: the server's default, 100; at most 1000),
// after cursor (the NextCursor of the page before; "" for the first).
// See AllCommands.
func (c *Client) Commands(ctx context.Context, id string, limit int, cursor string) (*CommandList, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var out CommandList
	if err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes/" + seg(id) + "/commands", query: q}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AllCommands iterates over every command started in a sandbox, oldest
// first, fetching pages as it goes.
func (c *Client) AllCommands(ctx context.Context, id string) iter.Seq2[Command, error] {
	return func(yield func(Command, error) bool) {
		cursor := ""
		for {
			page, err := c.Commands(ctx, id, 0, cursor)
			if err != nil {
				yield(Command{}, err)
				return
			}
			for _, cmd := range page.Commands {
				if !yield(cmd, nil) {
					return
				}
			}
			if page.NextCursor == "" || page.NextCursor == cursor {
				return
			}
			cursor = page.NextCursor
		}
	}
}
