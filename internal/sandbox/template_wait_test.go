package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// A create's template that is not ready yet is waited for while its build
// is queued or running (Config.AwaitTemplate, the server's template
// builds), bounded by Config.TemplateWait; one nobody builds is refused
// at once. Real store; the build's end is a store write as the server's
// Build makes it.
func TestReadyTemplateWaitsForItsBuild(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	building := map[string]chan struct{}{} // closed when the build ends
	svc := New(Config{DataDir: t.TempDir(), TemplateWait: 200 * time.Millisecond,
		AwaitTemplate: func(ctx context.Context, name string) (bool, error) {
			done, ok := building[name]
			if !ok {
				return false, nil
			}
			select {
			case <-done:
				return true, nil
			case <-ctx.Done():
				return true, ctx.Err()
			}
		}}, st, nil, slog.New(slog.DiscardHandler), nil)

	if _, err := svc.readyTemplate(ctx, "nobody-builds"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a template nobody builds: %v, want not found at once", err)
	}

	// Queued (no record yet): ready once the build records it.
	done := make(chan struct{})
	building["python-data"] = done
	go func() {
		_ = st.PutTemplate(context.WithoutCancel(ctx), store.Template{Name: "python-data", Digest: "d1", Kind: "dir", Status: store.TemplateReady})
		close(done)
	}()
	if tpl, err := svc.readyTemplate(ctx, "python-data"); err != nil || tpl.Digest != "d1" {
		t.Errorf("a template whose build ends while the create waits: %+v, %v", tpl, err)
	}

	// A build that outlasts the wait: 503, saying it still builds.
	building["slow"] = make(chan struct{})
	if err := st.PutTemplate(ctx, store.Template{Name: "slow", Digest: "d2", Kind: "dir", Status: store.TemplateBuilding}); err != nil {
		t.Fatal(err)
	}
	_, err = svc.readyTemplate(ctx, "slow")
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "still being built") {
		t.Errorf("a build that outlasts the wait: %v, want unavailable saying it still builds", err)
	}

	// A build that ends failed: refused with its status.
	failed := make(chan struct{})
	building["broken"] = failed
	go func() {
		_ = st.PutTemplate(context.WithoutCancel(ctx), store.Template{Name: "broken", Digest: "d3", Kind: "dir", Status: store.TemplateFailed, Error: "mirror down"})
		close(failed)
	}()
	if _, err := svc.readyTemplate(ctx, "broken"); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "failed") {
		t.Errorf("a build that failed: %v", err)
	}
}
