# A module the ranks import only from their second cycle on
# (integration/prewarm_auto_test.go).
VALUE = 2
