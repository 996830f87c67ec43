// Package deploy holds no code: it is the home of prefixd's deployment
// files (kubernetes/, grafana/, prometheus/, systemd/, docker/) and of the
// tests that keep them true to the binary. The tests render every
// kustomization, check images, ports, probes, selectors and every flag
// against the prefixd command tree, parse the alert rules and the
// dashboard's queries, and scrape a running daemon to require every metric
// they name. See README.md.
package deploy
