package snapshot

import "testing"

// Names that are not UTF-8 keep their bytes through a manifest on disk
// (JSON wrote them with U+FFFD: a restore made a file of another name and
// removed the real one).
func TestRawNamesSurvive(t *testing.T) {
	s := newStore(t)
	bad, badLink := "home/\xff\xfe", "\xfftarget"
	data := mkTar(t, dir("home"), file(bad, []byte("x")), symlink("home/link", badLink), file("home/ok", []byte("y")))
	m := mustPutTar(t, s, "raw", data, Meta{})
	root := s.root
	s.Close()
	s2, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.Open("raw")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Entries) != len(m.Entries) {
		t.Fatalf("%d entries, want %d", len(got.Entries), len(m.Entries))
	}
	if e, ok := got.Lookup(bad); !ok || e.Type != TypeFile {
		t.Errorf("entry %q lost: %+v", bad, got.Entries)
	}
	if e, ok := got.Lookup("home/link"); !ok || e.Link != badLink {
		t.Errorf("link target %q became %q", badLink, e.Link)
	}
	if _, ok := got.Lookup("home/ok"); !ok {
		t.Error("a plain entry lost")
	}
	infos, err := s2.List()
	if err != nil || len(infos) != 1 || infos[0].ID != "raw" {
		t.Errorf("List: %+v %v", infos, err)
	}
}
