package pgtest

import (
	"database/sql"
	"os"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// Each URL is a database of its own, empty, on one cluster whose default
// collation is not bytewise.
func TestURL(t *testing.T) {
	a, b := URL(t), URL(t)
	if a == b {
		t.Fatalf("two URLs are one database: %s", a)
	}
	for _, u := range []string{a, b} {
		db, err := sql.Open("pgx", u)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.ExecContext(t.Context(), `CREATE TABLE mine (x int)`); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		var lt bool
		if err := db.QueryRowContext(t.Context(), `SELECT 'a' < 'B'`).Scan(&lt); err != nil || !lt {
			t.Errorf("default collation orders 'a' < 'B' = %v (%v); want a natural-language collation", lt, err)
		}
	}
}
