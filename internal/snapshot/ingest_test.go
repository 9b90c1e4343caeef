package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
)

func TestPutTarRoundTrip(t *testing.T) {
	s := newStore(t)
	big := randBytes(1, 100<<20)
	small := []byte("hello, world\n")
	src := mkTar(t,
		dir("etc"),
		file("etc/hostname", small),
		file("etc/empty", nil),
		dir("home"),
		dir("home/user"),
		file("home/user/big.bin", big),
		file("home/user/日本語 ファイル.txt", []byte("ユニコード")),
		file("home/user/émoji-😀", []byte("x")),
		symlink("home/user/link", "../../etc/hostname"),
		symlink("abs", "/etc/hostname"),
		item{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "etc/hardlink", Linkname: "etc/hostname", ModTime: t0}},
		item{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o600, ModTime: t0}},
		item{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "x/exec", Mode: 0o4755, ModTime: t0, Size: 2,
			PAXRecords: map[string]string{"SCHILY.xattr.security.capability": "\x01\x02"}}, data: []byte("#!")},
	)
	start := time.Now()
	m, err := s.PutTar(t.Context(), "snap1", bytes.NewReader(src), Meta{Labels: map[string]string{"sandbox": "sb1"}})
	if err != nil {
		t.Fatal(err)
	}
	el := time.Since(start)
	t.Logf("PutTar %d MiB: %v (%.0f MB/s), bytes_new=%d", len(src)>>20, el, float64(len(src))/1e6/el.Seconds(), m.BytesNew)
	if m.Kind != KindFiles || m.Labels["sandbox"] != "sb1" || m.BytesTotal != int64(len(big)+len(small)+len("ユニコード")+1+2) {
		t.Errorf("manifest info = %+v", m.Info)
	}
	if n := len(m.Entries); n != 13 {
		t.Errorf("%d entries: %v", n, paths(m.Entries))
	}
	if e, _ := m.Lookup("home/user/big.bin"); len(e.Chunks) < 40 || len(e.Chunks) > 400 {
		t.Errorf("100 MiB file cut into %d chunks; want ~100", len(e.Chunks))
	}

	// The manifest on disk matches the one returned.
	m2, err := s.Open("snap1")
	if err != nil {
		t.Fatal(err)
	}
	if len(m2.Entries) != len(m.Entries) || m2.BytesNew != m.BytesNew || !m2.CreatedAt.Equal(m.CreatedAt) {
		t.Errorf("Open = %+v, want %+v", m2.Info, m.Info)
	}

	// ReadFile: content, symlinks followed.
	start = time.Now()
	for p, want := range map[string][]byte{
		"home/user/big.bin":      big,
		"/etc/hostname":          small,
		"etc/empty":              {},
		"home/user/link":         small,
		"abs":                    small,
		"etc/hardlink":           small,
		"home/user/日本語 ファイル.txt": []byte("ユニコード"),
	} {
		r, e, err := s.ReadFile(t.Context(), m2, p)
		if err != nil {
			t.Fatalf("ReadFile %s: %v", p, err)
		}
		h := sha256.New()
		n, err := io.Copy(h, r)
		r.Close()
		if err != nil || !bytes.Equal(h.Sum(nil), sha256Sum(want)) || e.Size != int64(len(want)) {
			t.Errorf("ReadFile %s: %d bytes (entry %d), %v; want %d bytes", p, n, e.Size, err, len(want))
		}
	}
	for p, class := range map[string]error{"nope": errdefs.ErrNotFound, "etc": errdefs.ErrInvalidArgument, "fifo": errdefs.ErrInvalidArgument} {
		if _, _, err := s.ReadFile(t.Context(), m2, p); !errors.Is(err, class) {
			t.Errorf("ReadFile %s: %v, want %v", p, err, class)
		}
	}

	t.Logf("reads: %v", time.Since(start))
	start = time.Now()
	// WriteTar of everything reproduces the stream entry by entry.
	var out bytes.Buffer
	if err := s.WriteTar(t.Context(), m2, &out, nil); err != nil {
		t.Fatal(err)
	}
	want, got := readTar(t, bytes.NewReader(src)), readTar(t, &out)
	if len(got) != len(want) {
		t.Errorf("WriteTar: %d entries, want %d", len(got), len(want))
	}
	t.Logf("WriteTar + parse: %v", time.Since(start))
	// Hardlinks come out linked the other way round (path order): same files.
	if g := got["etc/hardlink"]; g.hdr.Typeflag != tar.TypeReg || g.sum != want["etc/hostname"].sum {
		t.Errorf("WriteTar: etc/hardlink = %+v", g.hdr)
	}
	if g := got["etc/hostname"]; g.hdr.Typeflag != tar.TypeLink || g.hdr.Linkname != "etc/hardlink" {
		t.Errorf("WriteTar: etc/hostname = %+v", g.hdr)
	}
	delete(want, "etc/hardlink")
	delete(want, "etc/hostname")
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("WriteTar: %s missing", name)
			continue
		}
		if g.sum != w.sum || g.size != w.size || g.hdr.Typeflag != w.hdr.Typeflag || g.hdr.Mode != w.hdr.Mode ||
			g.hdr.Linkname != w.hdr.Linkname || g.hdr.Uid != w.hdr.Uid || !g.hdr.ModTime.Equal(w.hdr.ModTime) {
			t.Errorf("WriteTar: %s = %+v, want %+v", name, g.hdr, w.hdr)
		}
	}
	if got["x/exec"].hdr.PAXRecords["SCHILY.xattr.security.capability"] != "\x01\x02" {
		t.Errorf("xattr lost: %v", got["x/exec"].hdr.PAXRecords)
	}

	// MaterializeDir keeps hardlinks linked whichever name sorts first.
	dst := filepath.Join(t.TempDir(), "m")
	if err := s.MaterializeDir(t.Context(), m2, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(dst, "etc/hostname"))
	b, _ := os.Stat(filepath.Join(dst, "etc/hardlink"))
	if a == nil || b == nil || !os.SameFile(a, b) || a.Mode() != 0o644 {
		t.Errorf("etc/hostname and etc/hardlink not one file: %v %v", a, b)
	}
	if fi, err := os.Stat(filepath.Join(dst, "x/exec")); err != nil || fi.Mode() != 0o755|os.ModeSetuid {
		t.Errorf("x/exec: %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "home/user/link")); err != nil || l != "../../etc/hostname" {
		t.Errorf("link = %q, %v", l, err)
	}
	if fi, err := os.Lstat(filepath.Join(dst, "fifo")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("fifo: %v %v", fi, err)
	}

	// ListDir.
	if got := paths(ListDir(m2, "home/user")); !slices.Equal(got, []string{"home/user/big.bin", "home/user/link", "home/user/émoji-😀", "home/user/日本語 ファイル.txt"}) {
		t.Errorf("ListDir home/user = %q", got)
	}
	if got := paths(ListDir(m2, "/")); !slices.Equal(got, []string{"abs", "etc", "fifo", "home", "x"}) {
		t.Errorf("ListDir / = %q", got)
	}

	// Same id again is a conflict; bad ids are invalid.
	if _, err := s.PutTar(t.Context(), "snap1", bytes.NewReader(mkTar(t)), Meta{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("PutTar existing id: %v", err)
	}
	for _, id := range []string{"", "../x", ".hidden", "a/b", "x.tmp"} {
		if _, err := s.PutTar(t.Context(), id, bytes.NewReader(mkTar(t)), Meta{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("PutTar id %q: %v", id, err)
		}
	}
}

func TestPutTarRejectsEscapes(t *testing.T) {
	s := newStore(t)
	for _, name := range []string{"../etc/passwd", "a/../../b"} {
		_, err := s.PutTar(t.Context(), "x", bytes.NewReader(mkTar(t, file(name, []byte("x")))), Meta{})
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := s.PutTar(t.Context(), "x", bytes.NewReader([]byte("not a tar stream at all, just some words")), Meta{}); err == nil {
		t.Error("garbage stream accepted")
	}
	if _, err := s.Open("x"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("failed put left a snapshot: %v", err)
	}
}

func TestPutTarWhiteouts(t *testing.T) {
	s := newStore(t)
	src := mkTar(t,
		dir("a"),
		file("a/.wh.gone", nil), // OCI whiteout
		item{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "a/gone2", ModTime: t0}}, // overlayfs whiteout
		dir("b"),
		file("b/.wh..wh..opq", nil), // OCI opaque
		file("b/new", []byte("n")),
		item{hdr: tar.Header{Typeflag: tar.TypeDir, Name: "c/", Mode: 0o700, ModTime: t0,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.opaque": "y"}}}, // overlayfs opaque
		item{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3, Mode: 0o666, ModTime: t0}},
		file("d/.wh..wh..opq", nil), // marker without its directory entry
	)
	m := mustPutTar(t, s, "up", src, Meta{})
	want := map[string]EntryType{
		"a": TypeDir, "a/gone": TypeWhiteout, "a/gone2": TypeWhiteout,
		"b": TypeOpaque, "b/new": TypeFile, "c": TypeOpaque, "dev/null": TypeChar, "d": TypeOpaque,
	}
	got := map[string]EntryType{}
	for _, e := range m.Entries {
		got[e.Path] = e.Type
	}
	if len(got) != len(want) {
		t.Errorf("entries %v, want %v", got, want)
	}
	for p, typ := range want {
		if got[p] != typ {
			t.Errorf("%s: %q, want %q", p, got[p], typ)
		}
	}
	if e, _ := m.Lookup("c"); e.Mode != 0o700 || e.Xattrs != nil {
		t.Errorf("c = %+v", e)
	}

	// WriteTar writes an upper layer back in OCI form.
	var out bytes.Buffer
	if err := s.WriteTar(t.Context(), m, &out, nil); err != nil {
		t.Fatal(err)
	}
	names := readTar(t, bytes.NewReader(out.Bytes()))
	for _, n := range []string{"a/.wh.gone", "a/.wh.gone2", "b/", "b/.wh..wh..opq", "c/.wh..wh..opq", "dev/null"} {
		if _, ok := names[n]; !ok {
			t.Errorf("WriteTar: %s missing", n)
		}
	}
	// ... which ingests to the same manifest.
	m2 := mustPutTar(t, s, "up2", out.Bytes(), Meta{})
	if d := Diff(m, m2); len(d) != 0 {
		t.Errorf("re-ingested upper differs: %+v", d)
	}
}

func TestWriteTarChosenPaths(t *testing.T) {
	s := newStore(t)
	m := mustPutTar(t, s, "s", mkTar(t,
		dir("etc"), file("etc/a", []byte("a")), file("etc/b", []byte("b")),
		dir("home"), dir("home/u"), file("home/u/x", []byte("x")), file("home/u2", []byte("u2")),
		file("etc/hl-target", []byte("t")),
		item{hdr: tar.Header{Typeflag: tar.TypeLink, Name: "home/u/hl", Linkname: "etc/hl-target", ModTime: t0}},
	), Meta{})
	var out bytes.Buffer
	if err := s.WriteTar(t.Context(), m, &out, []string{"/home/u", "etc/b"}); err != nil {
		t.Fatal(err)
	}
	got := readTar(t, &out)
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"etc/b", "home/u/", "home/u/hl", "home/u/x"}) {
		t.Errorf("WriteTar chosen = %q", names)
	}
	// The hardlink's target is not in the stream: it became a file.
	if h := got["home/u/hl"]; h.hdr.Typeflag != tar.TypeReg || h.size != 1 {
		t.Errorf("hl = %+v", h.hdr)
	}
	if err := s.WriteTar(t.Context(), m, io.Discard, []string{"home/none"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("WriteTar missing path: %v", err)
	}
}

// mkTree writes a checkpoint-like directory: a few big image files and
// some small ones.
func mkTree(t *testing.T, root string, seed uint64) {
	writeFile(t, filepath.Join(root, "pages.img"), randBytes(seed, 40<<20), 0o600)
	writeFile(t, filepath.Join(root, "checkpoint.img"), randBytes(seed+1, 3<<20), 0o600)
	writeFile(t, filepath.Join(root, "meta/config.json"), []byte(`{"a":1}`), 0o644)
	writeFile(t, filepath.Join(root, "meta/empty"), nil, 0o640)
	if err := os.Symlink("pages.img", filepath.Join(root, "current")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "checkpoint.img"), filepath.Join(root, "meta/hardlink.img")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "emptydir"), 0o711); err != nil {
		t.Fatal(err)
	}
	old := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	os.Chtimes(filepath.Join(root, "meta/config.json"), old, old)
}

// treeSums maps each path under root to a description of it.
func treeSums(t *testing.T, root string) map[string]string {
	out := map[string]string{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		desc := fi.Mode().String()
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(rune(len(b))) + " " + string(sha256Sum(b)) + " " + fi.ModTime().UTC().String()
		case fi.Mode()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		case rel == ".":
			return nil // the root has no entry
		case fi.IsDir():
			desc += " " + fi.ModTime().UTC().String()
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sha256Sum(b []byte) []byte { s := sha256.Sum256(b); return s[:] }

func TestPutDirMaterializeDir(t *testing.T) {
	s := newStore(t)
	src := filepath.Join(t.TempDir(), "ckpt")
	mkTree(t, src, 7)
	start := time.Now()
	m, err := s.PutDir(t.Context(), "ck1", src, Meta{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("PutDir 43 MiB: %v (%.0f MB/s)", time.Since(start), float64(m.BytesTotal)/1e6/time.Since(start).Seconds())
	if m.Kind != KindCheckpoint {
		t.Errorf("kind %q", m.Kind)
	}
	if e, _ := m.Lookup("meta/hardlink.img"); e.Type != TypeHardlink && e.Type != TypeFile {
		t.Errorf("hardlink entry %+v", e)
	}
	dst := filepath.Join(t.TempDir(), "restored")
	if err := s.MaterializeDir(t.Context(), m, dst); err != nil {
		t.Fatal(err)
	}
	want, got := treeSums(t, src), treeSums(t, dst)
	if len(got) != len(want) {
		t.Errorf("restored %d paths, want %d", len(got), len(want))
	}
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: restored %q, want %q", p, got[p], w)
		}
	}
	var a, b os.FileInfo
	a, _ = os.Stat(filepath.Join(dst, "checkpoint.img"))
	b, _ = os.Stat(filepath.Join(dst, "meta/hardlink.img"))
	if !os.SameFile(a, b) {
		t.Error("hardlink not restored as a hardlink")
	}

	// Not into a non-empty directory.
	if err := s.MaterializeDir(t.Context(), m, dst); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("MaterializeDir into non-empty dir: %v", err)
	}
	if _, err := s.PutDir(t.Context(), "nope", filepath.Join(src, "missing"), Meta{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("PutDir missing dir: %v", err)
	}
}

func TestMaterializeDirStaysInside(t *testing.T) {
	s := newStore(t)
	outside := t.TempDir()
	m := mustPutTar(t, s, "evil", mkTar(t,
		symlink("esc", outside),
		file("esc/pwned", []byte("x")),
	), Meta{})
	dst := filepath.Join(t.TempDir(), "d")
	if err := s.MaterializeDir(t.Context(), m, dst); err == nil {
		t.Error("MaterializeDir wrote through an escaping symlink without error")
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
		t.Fatal("MaterializeDir wrote outside its directory")
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed MaterializeDir left %s behind: %v", dst, err)
	}
}
