package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/template"
)

// fakeBuilds makes every template build fail quickly after printing a
// line: a script named mmdebstrap first in PATH.
func fakeBuilds(t *testing.T) {
	t.Helper()
	fakeMmdebstrap(t, "echo 'I: fake build'\nexit 1\n")
}

func fakeMmdebstrap(t *testing.T, script string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "mmdebstrap"), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// cachedBuild puts a complete build of name under a made-up digest into
// the builder's cache (what an earlier recipe left there).
func cachedBuild(t *testing.T, b *template.Builder, name, seed string) template.Template {
	t.Helper()
	sum := sha256.Sum256([]byte(seed))
	tpl := template.Template{Name: name, Digest: hex.EncodeToString(sum[:]), Kind: template.KindDir, SizeBytes: 1 << 20, BuiltAt: time.Now().UTC()}
	dir := filepath.Join(b.Dir(), tpl.Digest)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(tpl)
	if err := os.WriteFile(filepath.Join(dir, "template.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	tpl.Path = filepath.Join(dir, "rootfs")
	return tpl
}

func newTestTemplates(t *testing.T) (*templates, *[]string) {
	t.Helper()
	st, err := store.Open(t.Context(), filepath.Join(t.TempDir(), "space.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b, err := template.NewBuilder(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var events []string // "ready NAME DIGEST" and "failed NAME", in order
	tpls := &templates{store: st, builder: b, log: slog.New(slog.DiscardHandler),
		ready:  func(r store.Template) { events = append(events, "ready "+r.Name+" "+r.Digest) },
		failed: func(name string) { events = append(events, "failed "+name) },
	}
	return tpls, &events
}

// A rebuild (a new recipe) keeps the template in service: creates and
// pools use the last good build while the new one runs and after it fails.
func TestRebuildKeepsServing(t *testing.T) {
	fakeBuilds(t)
	ctx := t.Context()
	tpls, events := newTestTemplates(t)
	old := cachedBuild(t, tpls.builder, "base", "an earlier base recipe")
	if err := tpls.store.PutTemplate(ctx, store.Template{Name: "base", Digest: old.Digest, Path: old.Path, Kind: "dir", Status: store.TemplateReady, BuiltAt: old.BuiltAt}); err != nil {
		t.Fatal(err)
	}
	servesOld := func(when string) store.Template {
		t.Helper()
		rec, err := tpls.store.GetTemplate(ctx, "base")
		if err != nil || rec.Status != store.TemplateReady || rec.Digest != old.Digest || rec.Path != old.Path {
			t.Fatalf("%s: record %+v, %v; want ready on the earlier build %s", when, rec, err, old.Digest[:12])
		}
		return rec
	}
	building := false
	_, err := tpls.Build(ctx, "base", func(line string) {
		if line == "I: fake build" {
			building = true
			servesOld("during the rebuild")
		}
	})
	if err == nil || !building {
		t.Fatalf("Build = %v (build ran: %v), want the fake build's failure", err, building)
	}
	if rec := servesOld("after the failed rebuild"); !strings.Contains(rec.Error, "failed") {
		t.Errorf("record error %q does not say the rebuild failed", rec.Error)
	}
	if want := []string{"ready base " + old.Digest}; !slices.Equal(*events, want) {
		t.Errorf("events %q, want %q (pools kept on the earlier build, never stopped)", *events, want)
	}

	// With no earlier build to keep, a failed build is what the record says.
	if _, err := tpls.Build(ctx, "python-data", nil); err == nil {
		t.Fatal("python-data built with a failing mmdebstrap")
	}
	if rec, err := tpls.store.GetTemplate(ctx, "python-data"); err != nil || rec.Status != store.TemplateFailed || rec.Error == "" {
		t.Errorf("python-data record %+v, %v; want failed", rec, err)
	}
	if (*events)[len(*events)-1] != "failed python-data" {
		t.Errorf("events %q: python-data's pools not stopped", *events)
	}
}

// Records a crashed server left building are settled by the next server's
// first build: ready when the cache has their build, else failed.
func TestInterruptedBuildSettled(t *testing.T) {
	fakeBuilds(t)
	ctx := t.Context()
	tpls, events := newTestTemplates(t)
	done := cachedBuild(t, tpls.builder, "base", "a build that finished before the crash")
	for _, rec := range []store.Template{
		{Name: "base", Digest: done.Digest, Kind: "dir", Status: store.TemplateBuilding},
		{Name: "python-data", Digest: template.PythonData().Digest(), Kind: "dir", Status: store.TemplateBuilding},
	} {
		if err := tpls.store.PutTemplate(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = tpls.Build(ctx, "base", nil) // the recipe differs: a rebuild, which fails
	if rec, err := tpls.store.GetTemplate(ctx, "base"); err != nil || rec.Status != store.TemplateReady || rec.Digest != done.Digest || rec.Path != done.Path {
		t.Errorf("base record %+v, %v; want ready on the build the crash left complete", rec, err)
	}
	if rec, err := tpls.store.GetTemplate(ctx, "python-data"); err != nil || rec.Status != store.TemplateFailed || !strings.Contains(rec.Error, "interrupted") {
		t.Errorf("python-data record %+v, %v; want failed as interrupted", rec, err)
	}
	if len(*events) == 0 || (*events)[0] != "ready base "+done.Digest {
		t.Errorf("events %q: the settled build was not announced", *events)
	}
}

// /healthz needs no key: it says how far the default template is, never
// the build's output or error (host paths, the mirror), which are logged.
func TestHealthHidesBuildDetail(t *testing.T) {
	fakeMmdebstrap(t, "echo 'I: fetching http://mirror.internal/debian into /srv/private/cache'\nsleep 0.3\necho 'E: mmdebstrap failed to run'\nexit 1\n")
	tpls, _ := newTestTemplates(t)
	h := &health{detail: "default template base not ready yet"} // as Serve makes it
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ensureTemplate(ctx, tpls, "base", slog.New(slog.DiscardHandler), nil)
	}()
	seen := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		ok, detail := h.get()
		if ok {
			t.Fatal("healthy although the default template failed to build")
		}
		seen[detail] = true
		if strings.Contains(detail, "failed") || time.Now().After(deadline) {
			break
		}
	}
	cancel()
	<-done
	want := map[string]bool{"default template base not ready yet": true, "template base: building": true, "template base: build failed, retrying": true}
	for detail := range seen {
		if !want[detail] {
			t.Errorf("healthz detail %q, want one of %q", detail, slices.Sorted(maps.Keys(want)))
		}
	}
}

// While an earlier build serves creates, a rebuild of the default template
// (a new recipe) does not take the server out of service.
func TestHealthyWhileRebuilding(t *testing.T) {
	fakeBuilds(t)
	tpls, _ := newTestTemplates(t)
	old := cachedBuild(t, tpls.builder, "base", "an earlier base recipe")
	if err := tpls.store.PutTemplate(t.Context(), store.Template{Name: "base", Digest: old.Digest, Path: old.Path, Kind: "dir", Status: store.TemplateReady}); err != nil {
		t.Fatal(err)
	}
	h := &health{detail: "default template base not ready yet"}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ensureTemplate(ctx, tpls, "base", slog.New(slog.DiscardHandler), nil)
	}()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if rec, err := tpls.store.GetTemplate(ctx, "base"); err == nil && rec.Error != "" {
			break // the rebuild failed
		}
		if time.Now().After(deadline) {
			t.Fatal("the rebuild did not fail")
		}
	}
	if ok, detail := h.get(); !ok {
		t.Errorf("healthz %q although the earlier build serves", detail)
	}
}

// A template this server is to build is "queued" in the list until its
// build starts and "building", with its last progress line, while it
// runs; Await waits for that build (until its context ends) and returns
// at once for a template nobody builds.
func TestTemplateBuildAwaited(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	fakeMmdebstrap(t, "echo 'I: fake build'\nwhile [ ! -e "+gate+" ]; do sleep 0.02; done\nexit 1\n")
	ctx := t.Context()
	tpls, _ := newTestTemplates(t)
	status := func() (string, string) {
		t.Helper()
		recs, err := tpls.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.Name == "python-data" {
				return r.Status, r.Progress
			}
		}
		t.Fatal("python-data not listed")
		return "", ""
	}
	if waited, err := tpls.Await(ctx, "python-data"); waited || err != nil {
		t.Fatalf("Await with no build: %v, %v", waited, err)
	}
	if st, _ := status(); st != statusNotBuilt {
		t.Errorf("before: %q, want %q", st, statusNotBuilt)
	}
	tpls.expect("python-data") // as Serve does before it serves
	if st, _ := status(); st != statusQueued {
		t.Errorf("expected: %q, want %q", st, statusQueued)
	}
	built := make(chan error, 1)
	go func() {
		_, err := tpls.Build(context.WithoutCancel(ctx), "python-data", nil)
		built <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st, line := status()
		if st == store.TemplateBuilding && line == "I: fake build" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the list never showed the build running: %q %q", st, line)
		}
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	waited, err := tpls.Await(short, "python-data")
	cancel()
	if !waited || err == nil {
		t.Fatalf("Await of a running build with a short context: %v, %v; want its context's error", waited, err)
	}
	tpls.settle("python-data") // Serve's count ends with its first attempt; the build's own goes on
	if st, _ := status(); st != store.TemplateBuilding {
		t.Errorf("still building: %q", st)
	}
	waitDone := make(chan error, 1)
	go func() {
		_, err := tpls.Await(ctx, "python-data")
		waitDone <- err
	}()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := <-built; err == nil {
		t.Fatal("the fake build succeeded")
	}
	if err := <-waitDone; err != nil {
		t.Errorf("Await across the build's end: %v", err)
	}
	if st, line := status(); st != store.TemplateFailed || line != "" {
		t.Errorf("after the build: %q %q, want failed with no progress", st, line)
	}
	if waited, err := tpls.Await(ctx, "python-data"); waited || err != nil {
		t.Errorf("Await after the build: %v, %v", waited, err)
	}
}
