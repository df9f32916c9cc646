"""The recipe side: the build layer every torch extension recipe lists, the variant matrix, the
source cache and `extforge recipe new`."""
