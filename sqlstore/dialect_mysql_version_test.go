package sqlstore

import "testing"

func TestMariaDBHasReturning(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"10.5.0-MariaDB":             true,
		"11.4.2-MariaDB-log":         true,
		"10.4.32-MariaDB":            false,
		"10.3.39-MariaDB-0+deb10u2":  false,
		"8.0.36":                     false,
		"8.4.0-commercial":           false,
		"9.1.0":                      false,
		"MariaDB":                    false,
		"":                           false,
	} {
		if got := mariaDBHasReturning(version); got != want {
			t.Errorf("mariaDBHasReturning(%q) = %v, want %v", version, got, want)
		}
	}
}
