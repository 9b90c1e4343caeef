package snapshot

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestMergeWhiteouts builds a template with PutDir, an upper layer with
// PutTar in both whiteout conventions, and checks the merged view.
func TestMergeWhiteouts(t *testing.T) {
	s := newStore(t)
	tmpl := t.TempDir()
	for p, body := range map[string]string{
		"etc/passwd": "root", "etc/hosts": "h", "etc/motd": "motd",
		"usr/bin/tool": "tool", "usr/lib/a.so": "a", "usr/lib/b.so": "b",
		"var/cache/x/1": "1", "var/cache/x/2": "2", "opt/app/old": "old",
		"srv/data/file": "f",
	} {
		writeFile(t, filepath.Join(tmpl, p), []byte(body), 0o644)
	}
	base, err := s.PutDir(t.Context(), "template", tmpl, Meta{Kind: KindFiles})
	if err != nil {
		t.Fatal(err)
	}
	if base.Kind != KindFiles {
		t.Errorf("kind %q", base.Kind)
	}
	upper := mustPutTar(t, s, "upper", mkTar(t,
		dir("etc"),
		file("etc/.wh.motd", nil),            // OCI whiteout of a file
		file("etc/hosts", []byte("changed")), // modified
		file("etc/new", []byte("new")),       // added
		dir("usr"),
		item{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "usr/lib", ModTime: t0}}, // overlayfs whiteout of a dir
		dir("var"), dir("var/cache"),
		dir("var/cache/x"), file("var/cache/x/.wh..wh..opq", nil), file("var/cache/x/3", []byte("3")), // opaque
		dir("opt"),
		item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "opt/app/", Mode: 0o700, ModTime: t0,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}}}, // opaque, empty
		file("srv/data", []byte("now a file")), // a directory replaced by a file
		file(".wh.nonexistent", nil),
	), Meta{Parent: "template"})

	view := Merge(base, upper)
	want := []string{
		"etc", "etc/hosts", "etc/new", "etc/passwd",
		"opt", "opt/app",
		"srv", "srv/data",
		"usr", "usr/bin", "usr/bin/tool",
		"var", "var/cache", "var/cache/x", "var/cache/x/3",
	}
	if got := paths(view.Entries); !slices.Equal(got, want) {
		t.Errorf("merged view:\n got %q\nwant %q", got, want)
	}
	for _, e := range view.Entries {
		if e.Type == TypeWhiteout || e.Type == TypeOpaque {
			t.Errorf("%s left as %s", e.Path, e.Type)
		}
	}
	if e, _ := view.Lookup("opt/app"); e.Mode != 0o700 || e.Type != TypeDir {
		t.Errorf("opt/app = %+v", e)
	}
	r, _, err := s.ReadFile(t.Context(), view, "etc/hosts")
	if err != nil || string(readAll(t, r)) != "changed" {
		t.Errorf("etc/hosts: %v", err)
	}
	if view.ID != "upper" || view.BytesNew != 0 || view.BytesTotal != int64(len("root"+"changed"+"new"+"now a file"+"tool"+"3")) {
		t.Errorf("view info = %+v", view.Info)
	}
	// Inputs untouched.
	if _, ok := base.Lookup("etc/motd"); !ok {
		t.Error("Merge modified base")
	}

	// Resolve does the same from ids.
	res, err := s.Resolve("template", "upper")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(paths(res.Entries), want) {
		t.Errorf("Resolve = %q", paths(res.Entries))
	}

	// A second layer over the view.
	upper2 := mustPutTar(t, s, "upper2", mkTar(t, file("etc/.wh.new", nil), file("usr/lib/c.so", []byte("c"))), Meta{})
	res2, err := s.Resolve("template", "upper", "upper2")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res2.Lookup("etc/new"); ok {
		t.Error("etc/new survived its whiteout")
	}
	if e, ok := res2.Lookup("usr/lib/c.so"); !ok || e.Type != TypeFile {
		t.Error("usr/lib/c.so missing")
	}
	_ = upper2

	// Diff of full views: what the sandbox changed.
	changes := Diff(base, view)
	got := map[string]ChangeKind{}
	for _, c := range changes {
		got[c.Path] = c.Kind
	}
	wantChanges := map[string]ChangeKind{
		"etc/motd": Removed, "etc/hosts": Modified, "etc/new": Added,
		"usr/lib": Removed, "usr/lib/a.so": Removed, "usr/lib/b.so": Removed,
		"var/cache/x/1": Removed, "var/cache/x/2": Removed, "var/cache/x/3": Added,
		"opt/app": Modified, "opt/app/old": Removed,
		"srv/data": Modified, "srv/data/file": Removed,
	}
	for p, k := range wantChanges {
		if got[p] != k {
			t.Errorf("Diff %s = %q, want %q", p, got[p], k)
		}
	}
	for p, k := range got {
		if _, ok := wantChanges[p]; !ok {
			t.Errorf("Diff: unexpected %s %s", k, p)
		}
	}
	for _, c := range changes {
		if c.Path == "etc/hosts" && (c.OldSize != 1 || c.NewSize != 7) {
			t.Errorf("etc/hosts sizes %d -> %d", c.OldSize, c.NewSize)
		}
	}

	// The view restores as a directory tree.
	dst := filepath.Join(t.TempDir(), "v")
	if err := s.MaterializeDir(t.Context(), res, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "srv/data")); err != nil || string(b) != "now a file" {
		t.Errorf("srv/data = %q, %v", b, err)
	}
	var out bytes.Buffer
	if err := s.WriteTar(t.Context(), res, &out, []string{"etc"}); err != nil {
		t.Fatal(err)
	}
	if n := len(readTar(t, &out)); n != 4 {
		t.Errorf("WriteTar etc: %d entries", n)
	}
}

func TestDiffMetadata(t *testing.T) {
	s := newStore(t)
	a := mustPutTar(t, s, "a", mkTar(t, file("f", []byte("x")), file("g", []byte("y")), symlink("l", "f")), Meta{})
	touched := file("f", []byte("x"))
	touched.hdr.ModTime = t0.Add(3600e9)
	chmod := file("g", []byte("y"))
	chmod.hdr.Mode = 0o600
	b := mustPutTar(t, s, "b", mkTar(t, touched, chmod, symlink("l", "g")), Meta{})
	d := Diff(a, b)
	if len(d) != 2 || d[0].Path != "g" || d[1].Path != "l" || d[0].Kind != Modified {
		t.Errorf("Diff = %+v (mtime alone must not count)", d)
	}
	if d := Diff(nil, a); len(d) != 3 || d[0].Kind != Added {
		t.Errorf("Diff(nil, a) = %+v", d)
	}
}
